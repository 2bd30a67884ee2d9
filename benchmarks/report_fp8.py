"""Markdown and PNG of a bench_fp8.py result: the speed and accuracy tables, and TFLOP/s of the FP8 and bf16
forwards by seqlen, one panel per head dim. Writes <result>.md and <result>.png beside the JSON.

    python benchmarks/report_fp8.py benchmarks/results/2026-11-23_h100_fp8.json
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def markdown(result: dict) -> str:
    mm = result["matmul"]
    # the setup of bench_fp8.py (recorded in the metadata since 2026-11-23's run)
    tokens, hidden = result["meta"].get("tokens_per_batch", 16384), result["meta"].get("hidden", 2048)
    lines = ["# FP8 attention forward", ""] + [f"- {k}: {v}" for k, v in result["meta"].items()] + [
        "", f"Same run: FP8 matmul (torch._scaled_mm, {mm['n']}^3) {mm['fp8_tflops']:.0f} TFLOP/s, bf16 matmul "
        f"{mm['bf16_tflops']:.0f} TFLOP/s. Forward TFLOP/s, {tokens} tokens per batch, hidden {hidden}.", "",
        "| head dim | causal | seqlen | FP8 (ours) | bf16 (ours) | FP8 / bf16 | FP8 / FP8 matmul |",
        "|---:|:-:|---:|---:|---:|---:|---:|"]
    first = result["speed"][0]
    laid = "fp8_v_laid_tflops" in first  # bench_fp8.py's columns on 2026-11-23 (d2911cb): V passed pre-laid
    triton = "fp8_triton_tflops" in first
    if laid:
        lines[-2:] = [
            "FP8 (ours): flash_attn_func as called, V copied into the layout FP8 tensor cores read; V laid: V passed "
            "already in that layout (fp8.rows_contiguous); Triton: the Triton FP8 kernel, V laid. Backends: the "
            "kernels \"auto\" took (FP8 / bf16).", "",
            "| head dim | causal | seqlen | FP8 (ours) | FP8, V laid | FP8 Triton | bf16 (ours) | FP8 / bf16 | "
            "V laid / bf16 | V laid / FP8 matmul | backends |",
            "|---:|:-:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    elif triton:
        lines[-2:] = [
            "FP8 (ours): flash_attn_func as called, V copy included; FP8 Triton: the same call on the Triton FP8 "
            "kernel; V copy: the call's copy of V alone (µs). Backends: the kernels \"auto\" took (FP8 / bf16).", "",
            "| head dim | causal | seqlen | FP8 (ours) | FP8 Triton | bf16 (ours) | FP8 / bf16 | FP8 / FP8 matmul | "
            "V copy (µs) | backends |",
            "|---:|:-:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["speed"]:
        row = f"| {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | {r['fp8_tflops']:.0f} | "
        if laid:
            lines.append(row + f"{r['fp8_v_laid_tflops']:.0f} | {r['fp8_triton_tflops']:.0f} | "
                         f"{r['bf16_tflops']:.0f} | {r['fp8_over_bf16']:.2f} | "
                         f"{r['fp8_v_laid_tflops'] / r['bf16_tflops']:.2f} | "
                         f"{r['fp8_v_laid_tflops'] / mm['fp8_tflops']:.2f} | "
                         f"{r['fp8_backend']} / {r['bf16_backend']} |")
        elif triton:
            lines.append(row + f"{r['fp8_triton_tflops']:.0f} | {r['bf16_tflops']:.0f} | {r['fp8_over_bf16']:.2f} | "
                         f"{r['fp8_tflops'] / mm['fp8_tflops']:.2f} | {r['v_copy_us']:.0f} | "
                         f"{r['fp8_backend']} / {r['bf16_backend']} |")
        else:
            lines.append(row + f"{r['bf16_tflops']:.0f} | {r['fp8_over_bf16']:.2f} | "
                         f"{r['fp8_tflops'] / mm['fp8_tflops']:.2f} |")
    lines += ["", "Max abs error, head dim 128, seqlen 4096, 16 heads (float64 references):", "",
              "| data | causal | vs dequantised: ours FP8 | PyTorch FP8 | ratio | vs bf16 originals: ours FP8 | "
              "PyTorch FP8 | ours bf16 | PyTorch bf16 | max abs out |",
              "|---|:-:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["accuracy"]:
        d, o = r["dequantised"], r["original"]
        lines.append(f"| {'outliers' if r['outliers'] else 'random'} | {'yes' if r['causal'] else 'no'} | "
                     f"{d['ours_fp8']:.2e} | {d['pytorch_fp8']:.2e} | {d['ours_fp8'] / d['pytorch_fp8']:.2f} | "
                     f"{o['ours_fp8']:.2e} | {o['pytorch_fp8']:.2e} | "
                     f"{o['ours_bf16']:.2e} | {o['pytorch_bf16']:.2e} | {o['out_max']:.2e} |")
    if result.get("sweep"):
        fields = "(BLOCK_M, BLOCK_N, warps, stages)" if len(result["sweep"][0]["config"]) == 4 else \
            "of the Gluon FP8 kernel (BLOCK_N, STAGES, PINGPONG)"
        copy = ", the plan's V copy included" if result["sweep"][0].get("with_v_copy") else ""
        lines += ["", f"Tile sweep at seqlen 8192 {fields}{copy}: TFLOP/s", ""]
        lines += [f"- d{r['head_dim']} {'causal' if r['causal'] else 'full'} {tuple(r['config'])}: "
                  + (f"{r['tflops']:.0f}" if "tflops" in r else f"failed ({r['error']})") for r in result["sweep"]]
    return "\n".join(lines) + "\n"


def plot(path: Path, result: dict) -> Path:
    dims = sorted({r["head_dim"] for r in result["speed"]})
    fig, axes = plt.subplots(1, len(dims), figsize=(4 * len(dims), 3.6), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, dim in zip(axes, dims, strict=True):
        for causal, style in ((False, "-"), (True, "--")):
            rows = [r for r in result["speed"] if r["head_dim"] == dim and r["causal"] == causal]
            seqlens = [r["seqlen"] for r in rows]
            tag = "causal" if causal else "full"
            ax.plot(seqlens, [r["fp8_tflops"] for r in rows], "o" + style, color="C3", label=f"FP8 {tag}")
            if "fp8_triton_tflops" in rows[0]:
                ax.plot(seqlens, [r["fp8_triton_tflops"] for r in rows], "^" + style, color="C1",
                        label=f"FP8 Triton {tag}")
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
        path = Path(arg)
        result = json.loads(path.read_text())
        path.with_suffix(".md").write_text(markdown(result))
        print(path.with_suffix(".md"), plot(path, result))
