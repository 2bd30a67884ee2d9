"""Plot a decode benchmark result: effective bandwidth (share of the copy bandwidth) against cache length.

    python benchmarks/plot_decode.py benchmarks/results/<stem>_decode.json   # writes <stem>_decode.png
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


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


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(plot(Path(arg)))
