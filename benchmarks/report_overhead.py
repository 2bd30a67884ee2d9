"""Markdown table and bar chart of a host-overhead result set (python benchmarks/bench_overhead.py's JSON).

    python benchmarks/report_overhead.py benchmarks/results/2026-11-22_h200_overhead.json [more.json ...]

Writes FILE.md and FILE.png beside each FILE.json.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

IMPLS = ("flashattn2", "sdpa-flash", "sdpa-cudnn")


def markdown(rows: list[dict], start: dict | None, meta: dict) -> str:
    lines = [f"# Host time per call ({meta.get('device')}, torch {meta.get('torch')}, triton {meta.get('triton')}, "
             f"{meta.get('date_utc')}, commit {(meta.get('git_commit') or '?')[:7]})", "",
             "b=1, seqlen 128, 1 head (GQA: 4 query heads, 1 kv head), head dim 64, bf16; inputs with requires_grad; "
             "back-to-back calls, no cache flush; microseconds per call (median of repeats). The window and packed "
             "rows compare with SDPA's causal call of the same size.", "",
             "| case | ours fwd | SDPA-flash fwd | cuDNN fwd | ours / flash fwd | ours fwd+bwd | SDPA-flash fwd+bwd "
             "| cuDNN fwd+bwd | ours / flash fwd+bwd |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(x):
        return "-" if x is None else f"{x:.0f}"

    for r in rows:
        cells = []
        for mode in ("fwd", "fwd_bwd"):
            ours, flash, cudnn = (r.get(f"{impl}_{mode}") for impl in IMPLS)
            cells += [f(ours), f(flash), f(cudnn), "-" if not (ours and flash) else f"{ours / flash:.2f}"]
        lines.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    if start:
        lines += ["", "Start-up (seconds; fresh interpreters; first call = forward, then backward, bf16, "
                  "b=2, seqlen 1024, 8 heads, head dim 128, causal, then a second option set: not causal):", "",
                  f"- `import torch`: {start['import_torch_s']:.2f} s; `import flashattn2` on top: "
                  f"{start['import_flashattn2_s']:.2f} s"]
        for which in ("cold_cache", "warm_cache"):
            c = start[which]
            lines.append(f"- {which.replace('_', ' ')}: first forward {c['first_fwd_s']:.2f}, first backward "
                         f"{c['first_bwd_s']:.2f}; next option set forward {c['next_option_set_fwd_s']:.2f}, "
                         f"backward {c['next_option_set_bwd_s']:.2f}")
    return "\n".join(lines) + "\n"


def plot(path: Path) -> Path:
    data = json.loads(path.read_text())
    rows, meta = data["rows"], data["meta"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, mode in zip(axes, ("fwd", "fwd_bwd"), strict=True):
        width = 0.8 / len(IMPLS)
        for i, impl in enumerate(IMPLS):
            values = [row.get(f"{impl}_{mode}") or 0 for row in rows]
            ax.bar([x + i * width for x in range(len(rows))], values, width, label=impl)
        ax.set_xticks([x + width for x in range(len(rows))], [row["case"] for row in rows], rotation=30)
        ax.set_title(f"{mode.replace('_', '+')}: microseconds per call")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"host time per call, b=1 s=128 h=1 d=64 bf16 — {meta['device']}, torch {meta['torch']}, "
                 f"triton {meta['triton']}, {meta['date_utc'][:10]}", fontsize=10)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=90)
    return out


def main(argv: list[str]) -> int:
    for arg in argv:
        path = Path(arg)
        data = json.loads(path.read_text())
        path.with_suffix(".md").write_text(markdown(data["rows"], data.get("startup"), data["meta"]))
        print(path.with_suffix(".md"), plot(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
