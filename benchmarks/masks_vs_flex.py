"""Masked attention against FlexAttention (torch.compile'd), issue 24's mask cells: 32k tokens, head dim
128, 16 heads, bf16; plain causal, a causal 4k sliding window, and eight packed causal documents (ours
through flash_attn_varlen_func, Flex through a document mask). Forward and backward timed apart, in the
same run; "batch": the documents as a dense batch of eight causal sequences (what a packed batch could reach).
TFLOP/s count the (query, key) pairs each mask lets through (4·d flops each forward, 2.5x that
backward). Writes <out>/<stem>.json and prints a table:
    python benchmarks/masks_vs_flex.py --out benchmarks/results [--stem NAME] [--backends auto triton]"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch._functorch.config
import triton
import triton.testing

import flashattn2
from bench_features import time_fwd_bwd
from flashattn2 import flash_attn_func, flash_attn_varlen_func

TOKENS, HEADS, HDIM, WINDOW, DOCS = 32768, 16, 128, 4096, 8


def _pairs(mask: str) -> int:
    n, doc = TOKENS, TOKENS // DOCS
    if mask == "causal":
        return n * (n + 1) // 2
    if mask == "window":
        return sum(min(i + 1, WINDOW) for i in range(n))
    return DOCS * doc * (doc + 1) // 2  # documents, and the same sequences as a dense batch


def _bench(attn, leaves) -> tuple[float, float]:
    """Median ms of attn(*leaves) (no grad) and of its backward alone."""
    return time_fwd_bwd(lambda: attn(*leaves), leaves, warmup=25, rep=100)


def _flex(mask: str):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc_len = TOKENS // DOCS

    def mask_mod(b, h, q_idx, kv_idx):
        keep = q_idx >= kv_idx
        if mask == "window":
            keep = keep & (q_idx - kv_idx < WINDOW)
        if mask == "documents":
            keep = keep & (q_idx // doc_len == kv_idx // doc_len)
        return keep

    compiled = torch.compile(flex_attention)
    if mask == "batch":
        # the documents as a dense batch of DOCS causal sequences
        block_mask = create_block_mask(mask_mod, None, None, doc_len, doc_len, device="cuda")
        return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)
    block_mask = create_block_mask(mask_mod, None, None, TOKENS, TOKENS, device="cuda")
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _ours(mask: str):
    if mask == "documents":
        cu = torch.arange(0, TOKENS + 1, TOKENS // DOCS, dtype=torch.int32, device="cuda")
        doc = TOKENS // DOCS
        return lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, doc, doc, causal=True)
    if mask == "batch":
        return lambda q, k, v: flash_attn_func(q, k, v, causal=True)
    window = (WINDOW - 1, 0) if mask == "window" else (-1, -1)
    return lambda q, k, v: flash_attn_func(q, k, v, causal=True, window_size=window)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--stem", default=f"{time.strftime('%Y-%m-%d')}_masks_vs_flex")
    ap.add_argument("--backends", nargs="+", default=["auto"], help="flashattn2 backends to time")
    args = ap.parse_args()
    # Flex's compiled backward donates buffers, which forbids the retain_graph=True the timing loop needs
    torch._functorch.config.donated_buffer = False
    torch.manual_seed(0)
    # (batch, seqlen, heads, dim) for ours; Flex takes (batch, heads, seqlen, dim)
    q, k, v = (torch.randn(1, TOKENS, HEADS, HDIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    rows = []
    for mask in ("causal", "window", "documents", "batch"):
        flops = 4 * HEADS * HDIM * _pairs(mask)
        shaped = [x.view(DOCS, TOKENS // DOCS, HEADS, HDIM) if mask == "batch" else x for x in (q, k, v)]
        # a packed batch is (tokens, heads, head_dim) leaves: indexing a batch dimension away would time a
        # select's backward (zeros and a copy per gradient) as well
        leaves = [(x[0] if mask == "documents" else x).clone().requires_grad_() for x in shaped]
        timings = {}
        for backend in args.backends:
            flashattn2.set_backend(backend)
            timings[f"flashattn2-{backend}"] = _bench(_ours(mask), leaves)
        flashattn2.set_backend("auto")
        flex_leaves = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in shaped]
        timings["flex"] = _bench(_flex(mask), flex_leaves)
        for name, (fwd, bwd) in timings.items():
            row = dict(mask=mask, impl=name, fwd_ms=fwd, bwd_ms=bwd, fwd_tflops=flops / fwd / 1e9,
                       bwd_tflops=2.5 * flops / bwd / 1e9)
            rows.append(row)
            print(f"{mask:10s} {name:18s} fwd {row['fwd_tflops']:6.1f}  bwd {row['bwd_tflops']:6.1f} TFLOP/s "
                  f"({fwd:.3f} / {bwd:.3f} ms)", flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d"), tokens=TOKENS, heads=HEADS, head_dim=HDIM, window=WINDOW, docs=DOCS)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / f"{args.stem}.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
