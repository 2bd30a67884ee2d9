"""Markdown and PNG of a masks_vs_flex.py or bench_flex.py result: forward and backward TFLOP/s per mask and
implementation, and each over FlexAttention's. Writes <result>.md and <result>.png beside the JSON.

    python benchmarks/report_masks.py benchmarks/results/2026-11-24_masks_vs_flex.json
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = ["# Masked attention against FlexAttention", ""] + [f"- {k}: {v}" for k, v in meta.items()] + [
        "", f"TFLOP/s over the (query, key) pairs each mask keeps; {meta['tokens']} tokens, {meta['heads']} heads, "
        f"head dim {meta['head_dim']}; window: causal, {meta['window']} keys; documents: {meta['docs']} packed "
        "causal documents (flash_attn: flash_attn_varlen_func; Flex: a document mask)." + (
            f" prefix_lm: causal with a {meta['prefix']}-key prefix every query sees; block_sparse: random 128 x 128 "
            f"blocks at {meta['density']:.0%} density plus the diagonal; alibi / softcap: causal with the score_mod "
            f"(flash_attn_func: alibi_slopes / softcap={meta['softcap']}; flashattn2's flex: compiled into the "
            "Gluon kernels on Hopper, the portable ones elsewhere; before 2026-11-25f the portable ones "
            "everywhere). "
            "flashattn2-flex: flashattn2.flex_attention under the auto backend (the Gluon kernels on Hopper where "
            "they take the call), -triton: the portable kernels." if "prefix" in meta else ""), "",
        "| mask | implementation | fwd TFLOP/s | bwd TFLOP/s | fwd / Flex | bwd / Flex |",
        "|---|---|---:|---:|---:|---:|"]
    flex = {r["mask"]: r for r in result["rows"] if r["impl"] == "flex"}
    for r in result["rows"]:
        f = flex[r["mask"]]
        lines.append(f"| {r['mask']} | {r['impl']} | {r['fwd_tflops']:.1f} | {r['bwd_tflops']:.1f} | "
                     f"{r['fwd_tflops'] / f['fwd_tflops']:.2f} | {r['bwd_tflops'] / f['bwd_tflops']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    masks = list(dict.fromkeys(r["mask"] for r in result["rows"]))
    impls = list(dict.fromkeys(r["impl"] for r in result["rows"]))
    by = {(r["mask"], r["impl"]): r for r in result["rows"]}
    fig, axes = plt.subplots(1, 2, figsize=(max(11, 2 * len(masks)), 4), sharey=True)
    width = 0.8 / len(impls)
    for ax, mode in zip(axes, ("fwd", "bwd"), strict=True):
        for i, impl in enumerate(impls):
            ax.bar([m + i * width for m in range(len(masks))],
                   [by[(mask, impl)][f"{mode}_tflops"] if (mask, impl) in by else 0.0 for mask in masks], width,
                   label=impl)
        ax.set_xticks([m + width * (len(impls) - 1) / 2 for m in range(len(masks))], masks)
        ax.set_title(f"{mode}, {result['meta']['device']}")
        ax.set_ylabel("TFLOP/s")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    path = Path(sys.argv[1])
    result = json.loads(path.read_text())
    path.with_suffix(".md").write_text(markdown(result))
    plot(result, path.with_suffix(".png"))
    print(path.with_suffix(".md"))


if __name__ == "__main__":
    main()
