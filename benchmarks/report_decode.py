"""Markdown and plot of a decode benchmark result (python benchmarks/bench_decode.py's JSON): the bandwidth table,
and effective bandwidth (share of the copy bandwidth) against cache length.

    python benchmarks/report_decode.py benchmarks/results/<stem>_decode.json   # writes <stem>_decode.md and .png
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench_decode import HDIM, NHEADS  # noqa: E402


def markdown(result: dict) -> str:
    meta, rows = result["meta"], result["rows"]
    copy = result["copy_gbps"]
    lines = ["# flashattn2 decoding (seqlen_q = 1)", ""] + [f"- {k}: {v}" for k, v in meta.items()] + [
        f"- copy bandwidth (device-to-device, read + write): {copy:.0f} GB/s", "",
        f"bf16, head dim {HDIM}, {NHEADS} query heads; cache full to seqlen. GB/s = bytes of K and V / time; "
        "% = of the copy bandwidth.", ""]
    names = []
    for r in rows:
        names += [k[:-5] for k in r if k.endswith("_gbps") and k[:-5] not in names]
    lines += ["| kv heads | batch | cache | KV GB | " + " | ".join(f"{n} GB/s (%)" for n in names) + " |",
              "|---:|---:|---:|---:|" + "---:|" * len(names)]
    for r in rows:
        cells = []
        for n in names:
            g = r.get(f"{n}_gbps")
            cells.append("n/a" if g is None else f"{g:.0f} ({100 * g / copy:.0f}%)")
        head = f"| {r['nheads_k']} | {r['batch']} | {r['seqlen']} | {r['kv_gb']:.3f} | "
        lines.append(head + " | ".join(cells) + " |")
    errors = {(n, e) for r in rows for n, e in r.items() if n.endswith("_error")}
    if errors:
        lines += ["", "Peers that refused a shape:"] + sorted({f"- {n[:-6]}: {e}" for n, e in errors})
    g = result.get("graph")
    if g:
        lines += ["", f"Decode loop (append + attend, batch {g['batch']}, cache {g['seqlen']}, "
                  f"{g['nheads_k']} kv heads): eager {g['eager_us_per_step']:.1f} us/step, "
                  f"CUDA graph {g['graph_us_per_step']:.1f} us/step."]
    h = result.get("host")
    if h:
        lines += ["", "Host-bound wall time per call (batch 1, cache 1k, back to back):", ""]
        lines += [f"- {k}: {v:.1f} us" for k, v in h.items()]
    return "\n".join(lines) + "\n"


def plot(path: Path) -> Path:
    result = json.loads(path.read_text())
    copy, rows = result["copy_gbps"], result["rows"]
    panels = sorted({(r["nheads_k"], r["batch"]) for r in rows})
    names = sorted({k[:-5] for r in rows for k in r if k.endswith("_gbps")})
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(names)}  # one colour per series in every panel
    fig, axes = plt.subplots(2, (len(panels) + 1) // 2, figsize=(4.5 * ((len(panels) + 1) // 2), 7), squeeze=False,
                             sharey=True)
    for ax, (hk, batch) in zip(axes.flat, panels, strict=False):
        sel = sorted((r for r in rows if r["nheads_k"] == hk and r["batch"] == batch), key=lambda r: r["seqlen"])
        for name in names:
            pts = [(r["seqlen"], 100 * r[f"{name}_gbps"] / copy) for r in sel if f"{name}_gbps" in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name, color=colors[name],
                        linewidth=2.5 if name == "ours" else 1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{hk} kv heads, batch {batch}")
        ax.set_xlabel("cache length")
        ax.axhline(80, color="grey", linestyle=":")
    for row in axes:
        row[0].set_ylabel("% of copy bandwidth")
    legend = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=len(legend), fontsize=8)
    fig.subplots_adjust(bottom=0.12)
    fig.suptitle(f"decode, bf16, d128, 32 query heads: {result['meta']['device']}", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


def main(argv: list[str]) -> int:
    for arg in argv:
        path = Path(arg)
        path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())))
        print(path.with_suffix(".md"), plot(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
