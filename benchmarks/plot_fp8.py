"""PNG of a bench.fp8 result: TFLOP/s of the FP8 and bf16 forwards by seqlen, one panel per head dim.

    python benchmarks/plot_fp8.py benchmarks/results/2026-11-23_h100_fp8.json
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(path: Path) -> Path:
    result = json.loads(path.read_text())
    dims = sorted({r["head_dim"] for r in result["speed"]})
    fig, axes = plt.subplots(1, len(dims), figsize=(4 * len(dims), 3.6), sharey=True)
    for ax, dim in zip(list(axes) if len(dims) > 1 else [axes], dims, strict=True):
        for causal, style in ((False, "-"), (True, "--")):
            rows = [r for r in result["speed"] if r["head_dim"] == dim and r["causal"] == causal]
            seqlens = [r["seqlen"] for r in rows]
            tag = "causal" if causal else "full"
            ax.plot(seqlens, [r["fp8_tflops"] for r in rows], "o" + style, color="C3", label=f"FP8 {tag}")
            ax.plot(seqlens, [r["bf16_tflops"] for r in rows], "s" + style, color="C0", label=f"bf16 {tag}")
        ax.axhline(result["matmul"]["fp8_tflops"], color="C3", lw=0.8, alpha=0.5, label="FP8 matmul")
        ax.set_xscale("log", base=2)
        ax.set_title(f"head dim {dim}")
        ax.set_xlabel("seqlen")
    axes[0].set_ylabel("forward TFLOP/s")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{result['meta'].get('device', '')}, {result['meta'].get('date_utc', '')}", fontsize=9)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(plot(Path(arg)))
