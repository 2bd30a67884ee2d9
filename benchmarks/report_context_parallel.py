"""Markdown of a bench_context_parallel.py result: times per method, scaling efficiency, errors, topology.
Writes <result>.md beside the JSON.

    python benchmarks/report_context_parallel.py benchmarks/results/<stem>_context_parallel.json
"""

import json
import sys
from pathlib import Path


def markdown(result: dict) -> str:
    meta = result["meta"]
    columns = list(result["rows"][0]["ms"]) if result["rows"] else []
    lines = [f"# Context parallelism: {meta['device']} x {meta['world_size']}", "",
             f"torch {meta['torch']}, triton {meta['triton']}, {meta['date_utc']}, commit {meta['git_commit']}. "
             f"Batch 1, {meta['dtype']}, head dim {meta['headdim']}; forward + backward, ms (the slowest rank's); "
             "efficiency = t(1 GPU) / (W x t(W GPUs)); ring-comm: the ring's messages alone.", "",
             "| heads | causal | seqlen | " + " | ".join(columns) + " | eff. ring-zigzag | eff. ulysses |",
             "|---:|---|---:|" + "---:|" * (len(columns) + 2)]
    for row in result["rows"]:
        cells = ["n/a" if row["ms"].get(c) is None else f"{row['ms'][c]:.1f}" for c in columns]
        eff = [f"{row['efficiency'][c]:.2f}" if c in row["efficiency"] else "n/a" for c in ("ring-zigzag", "ulysses")]
        lines.append(f"| {row['nheads']} | {row['causal']} | {row['seqlen']} | " + " | ".join(cells + eff) + " |")
    errors = sorted({f"- {name}: {error}" for row in result["rows"] for name, error in row["errors"].items()})
    if errors:
        lines += ["", "Errors (each once):", "", *errors]
    if meta.get("topology"):
        lines += ["", "`nvidia-smi topo -m`:", "", "```", meta["topology"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        path = Path(arg)
        path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())))
        print(path.with_suffix(".md"))
