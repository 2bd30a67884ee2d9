"""Bar chart of a host-overhead result set (python -m flashattn2.bench.overhead's JSON).

    python benchmarks/plot_overhead.py benchmarks/results/2026-11-22_h200_overhead.json [more.json ...]

Writes FILE.png beside each FILE.json.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

IMPLS = ("flashattn2", "sdpa-flash", "sdpa-cudnn")


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


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(plot(Path(name)))
