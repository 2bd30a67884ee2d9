"""python benchmarks/bench_features.py: what each training feature costs, and what the window saves.

bf16, head dim 128, 16 heads, 16k tokens. Each row times forward and backward of one variant next to
its baseline in the same run:
  window   seqlen 16k, causal + window (1024, 0)   vs  full causal (the cost should follow the window)
  alibi    seqlen 4k, causal + ALiBi               vs  plain causal, and SDPA with the bias as a mask
  softcap  seqlen 4k, causal + softcap 30          vs  plain causal
  dropout  seqlen 4k, causal + dropout 0.1         vs  plain causal, and SDPA-flash with dropout
  varlen   packed sequences of mixed lengths       vs  the same batch padded (ours and SDPA-flash)
Writes <out-dir>/<stem>_features.json, .md and .png.
"""

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn2.bench import collect_meta, default_stem

HEADS, HDIM, TOKENS = 16, 128, 16384


def time_fwd_bwd(fn: Callable[[], torch.Tensor], leaves: list[torch.Tensor], warmup: int = 20,
                 rep: int = 80) -> tuple[float, float]:
    """Median ms of the forward (no grad) and of the backward alone (masks_vs_flex.py times with it too)."""
    import triton.testing

    with torch.no_grad():
        fn()
        fwd = triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    out = fn()
    dout = torch.randn_like(out)
    out.backward(dout, retain_graph=True)
    bwd = triton.testing.do_bench(lambda: out.backward(dout, retain_graph=True), warmup=warmup, rep=rep,
                                  grad_to_none=leaves, return_mode="median")
    return fwd, bwd


def _rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)


def _row(feature: str, variant: str, fwd: float, bwd: float) -> dict:
    line = {"feature": feature, "variant": variant, "fwd_ms": fwd, "bwd_ms": bwd}
    print(f"{feature:8s} {variant:44s} fwd {fwd:8.3f} ms  bwd {bwd:8.3f} ms", flush=True)
    return line


def _sdpa(q, k, v, backend, **kwargs):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def run() -> list[dict]:
    from flashattn2 import flash_attn_func, flash_attn_varlen_func

    rows = []
    # window: the sequence is 16x the window, so the windowed run should cost ~1/8 of full causal
    q, k, v = (_rand(1, 16384, HEADS, HDIM) for _ in range(3))
    for variant, kwargs in (("causal", {}), ("causal + window (1024, 0)", {"window_size": (1024, 0)})):
        rows.append(_row("window", variant, *time_fwd_bwd(
            lambda kwargs=kwargs: flash_attn_func(q, k, v, causal=True, **kwargs), [q, k, v])))
    del q, k, v

    q, k, v = (_rand(4, 4096, HEADS, HDIM) for _ in range(3))
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    slopes = torch.rand(HEADS, device="cuda", dtype=torch.float32) * 0.1
    rows.append(_row("baseline", "causal (ours)", *time_fwd_bwd(
        lambda: flash_attn_func(q, k, v, causal=True), [q, k, v])))
    rows.append(_row("alibi", "causal + ALiBi (ours)", *time_fwd_bwd(
        lambda: flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes), [q, k, v])))
    pos = torch.arange(4096, device="cuda")
    bias = (-slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs()).masked_fill(
        pos[None, :] > pos[:, None], float("-inf")).to(torch.bfloat16)[None]
    rows.append(_row("alibi", "causal + ALiBi as a mask (SDPA mem-eff)", *time_fwd_bwd(
        lambda bias=bias: _sdpa(qt, kt, vt, SDPBackend.EFFICIENT_ATTENTION, attn_mask=bias), [qt, kt, vt])))
    del bias
    rows.append(_row("softcap", "causal + softcap 30 (ours)", *time_fwd_bwd(
        lambda: flash_attn_func(q, k, v, causal=True, softcap=30.0), [q, k, v])))
    rows.append(_row("dropout", "causal + dropout 0.1 (ours)", *time_fwd_bwd(
        lambda: flash_attn_func(q, k, v, causal=True, dropout_p=0.1), [q, k, v])))
    rows.append(_row("dropout", "causal (SDPA-flash)", *time_fwd_bwd(
        lambda: _sdpa(qt, kt, vt, SDPBackend.FLASH_ATTENTION, is_causal=True), [qt, kt, vt])))
    rows.append(_row("dropout", "causal + dropout 0.1 (SDPA-flash)", *time_fwd_bwd(
        lambda: _sdpa(qt, kt, vt, SDPBackend.FLASH_ATTENTION, is_causal=True, dropout_p=0.1), [qt, kt, vt])))
    del q, k, v, qt, kt, vt

    # varlen: 16k tokens in sequences of 256 to 4096 tokens, against the batch padded to the longest
    gen = torch.Generator().manual_seed(0)
    lengths = []
    while sum(lengths) < TOKENS - 256:
        lengths.append(min(int(torch.randint(256, 4097, (1,), generator=gen)), TOKENS - sum(lengths)))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    longest = max(lengths)
    q, k, v = (_rand(sum(lengths), HEADS, HDIM) for _ in range(3))
    rows.append(_row("varlen", f"packed, {len(lengths)} sequences, causal (ours)", *time_fwd_bwd(
        lambda: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True), [q, k, v])))
    qp, kp, vp = (_rand(len(lengths), longest, HEADS, HDIM) for _ in range(3))
    rows.append(_row("varlen", f"padded to {len(lengths)} x {longest}, causal (ours)", *time_fwd_bwd(
        lambda: flash_attn_func(qp, kp, vp, causal=True), [qp, kp, vp])))
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (qp, kp, vp))
    rows.append(_row("varlen", f"padded to {len(lengths)} x {longest}, causal (SDPA-flash)", *time_fwd_bwd(
        lambda: _sdpa(qt, kt, vt, SDPBackend.FLASH_ATTENTION, is_causal=True), [qt, kt, vt])))
    return rows


def write(rows: list[dict], meta: dict, out_dir: Path, stem: str) -> list[Path]:
    """<stem>_features.json and .md (the PNG: python benchmarks/plot_bench.py <stem>_features.json)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}_features.json", out_dir / f"{stem}_features.md"]
    paths[0].write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# flashattn2 feature costs", ""] + [f"- {k}: {v}" for k, v in meta.items()] + [
        "", f"bf16, head dim {HDIM}, {HEADS} heads; median ms of forward and of backward.", "",
        "| feature | variant | fwd ms | bwd ms |", "|---|---|---:|---:|"]
    lines += [f"| {r['feature']} | {r['variant']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} |" for r in rows]
    paths[1].write_text("\n".join(lines) + "\n")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_features.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--tag", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: the feature benchmark needs one", file=sys.stderr)
        return 2
    start = time.time()
    save(run(), write, argv, "python benchmarks/bench_features.py", start, args.out_dir, args.tag)
    return 0


def save(rows: list[dict], write: Callable, argv: list[str] | None, prog: str, start: float, out_dir: str,
         tag: str | None) -> None:
    """A run's result set through its write(rows, meta, out_dir, stem), meta naming the device, versions, date and
    seconds taken; prints where it went."""
    meta = collect_meta(torch.cuda.get_device_name(), argv, prog=prog)
    meta["elapsed_s"] = round(time.time() - start, 1)
    stem = tag or default_stem(torch.cuda.get_device_name())
    for path in write(rows, meta, Path(out_dir), stem):
        print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
