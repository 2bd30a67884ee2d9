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
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, (hk, batch) in zip(axes[0], panels, strict=True):
        sel = sorted((r for r in rows if r["nheads_k"] == hk and r["batch"] == batch), key=lambda r: r["seqlen"])
        names = sorted({k[:-5] for r in sel for k in r if k.endswith("_gbps")})
        for name in names:
            pts = [(r["seqlen"], 100 * r[f"{name}_gbps"] / copy) for r in sel if f"{name}_gbps" in r]
            ax.plot(*zip(*pts, strict=True), marker="o", label=name, linewidth=2.5 if name == "ours" else 1)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{hk} kv heads, batch {batch}")
        ax.set_xlabel("cache length")
        ax.axhline(80, color="grey", linestyle=":")
    axes[0][0].set_ylabel("% of copy bandwidth")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"decode, bf16, d128, 32 query heads: {result['meta']['device']}", fontsize=10)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(plot(Path(arg)))
