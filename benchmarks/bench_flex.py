"""flashattn2.flex_attention against torch's FlexAttention (torch.compile'd) and flash_attn_func, issue 26's cells:
32k tokens, 16 heads, head dim 128, bf16, one sequence. Masks: causal, a causal 4k sliding window, 8 packed causal
documents (ids as a captured tensor), prefix-LM (8k prefix), random block-sparse at 25% density (a captured block
table), and ALiBi and softcap as score_mods over causal (compiled into flashattn2's flex kernels;
flash_attn_func takes them as alibi_slopes / softcap). flash_attn_func runs the masks it expresses (causal,
window, ALiBi, softcap; the documents through flash_attn_varlen_func). Forward and backward timed apart, in the
same run. TFLOP/s count the (query, key) pairs each mask lets through (4·d flops each forward, 2.5x that backward).

    python benchmarks/bench_flex.py --out DIR [--masks causal documents] [--sweep] [--head-dim 64 --dtype float16]

--head-dim keeps the hidden size at 2048 (heads = 2048 / head dim); --dtype float16 or bfloat16 (the default).

--sweep also times flashattn2's flex kernels over tile configurations (kernels.portable.flex.OVERRIDE) on the
causal and documents masks, and reports the best per kernel. Writes DIR/<stem>.json and prints a table.
"""

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch._functorch.config
import triton
import triton.testing
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import flashattn2
from bench_features import time_fwd_bwd
from flashattn2 import flash_attn_func, flash_attn_varlen_func
from flashattn2.kernels.backends import flex_forward_backend
from flashattn2.kernels.portable import flex as flex_kernels

DEVICE = "cuda"
TOKENS, HEADS, HDIM, WINDOW, DOCS, PREFIX, DENSITY, SOFTCAP = 32768, 16, 128, 4096, 8, 8192, 0.25, 30.0
DTYPE = torch.bfloat16
BACKENDS = ["auto"]  # flashattn2 backends timed on the flex rows (--backends)
MASKS = ("causal", "window", "documents", "prefix_lm", "block_sparse", "alibi", "softcap")
SWEEP = {
    "fwd": [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 3), (64, 128, 4, 2)],
    "dq": [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (64, 32, 4, 3), (128, 32, 8, 2)],
    "dkdv": [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 8, 2), (32, 128, 4, 2), (64, 128, 4, 2), (32, 64, 4, 3)],
}


def _mods(mask: str):
    """(mask_mod, score_mod) of a mask; captured tensors live on the GPU."""
    doc_ids = torch.arange(TOKENS, device=DEVICE) // (TOKENS // DOCS)
    n_blocks = TOKENS // 128
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    table = (torch.rand(n_blocks, n_blocks, device=DEVICE, generator=gen) < DENSITY) | \
        torch.eye(n_blocks, dtype=torch.bool, device=DEVICE)  # every row sees its own block
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / HEADS) for h in range(HEADS)], device=DEVICE)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)

    def documents(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc_ids[q_idx] == doc_ids[kv_idx])

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx < PREFIX) | (q_idx >= kv_idx)

    def block_sparse(b, h, q_idx, kv_idx):
        return table[q_idx // 128, kv_idx // 128]

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def softcap(score, b, h, q_idx, kv_idx):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    mods = dict(causal=(causal, None), window=(window, None), documents=(documents, None),
                prefix_lm=(prefix_lm, None), block_sparse=(block_sparse, None), alibi=(causal, alibi),
                softcap=(causal, softcap))
    return mods[mask], slopes


def _pairs(block_mask) -> int:
    """(query, key) pairs a mask lets through, counted from its dense form in chunks of query rows."""
    from torch.nn.attention.flex_attention import create_mask

    total = 0
    step = min(2048, TOKENS)
    for lo in range(0, TOKENS, step):
        def rows(b, h, q_idx, kv_idx, lo=lo):
            return block_mask.mask_mod(b, h, q_idx + lo, kv_idx)
        total += int(create_mask(rows, 1, 1, step, TOKENS, device=DEVICE).sum())
    return total


def _ours_dense(mask: str, slopes):
    """flash_attn_func / varlen for the masks it expresses, on (batch, seqlen, heads, dim) views; else None."""
    if mask == "documents":
        cu = torch.arange(0, TOKENS + 1, TOKENS // DOCS, dtype=torch.int32, device=DEVICE)
        doc = TOKENS // DOCS
        return lambda q, k, v: flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, doc, doc, causal=True)
    if mask == "window":
        return lambda q, k, v: flash_attn_func(q, k, v, causal=True, window_size=(WINDOW - 1, 0))
    if mask == "causal":
        return lambda q, k, v: flash_attn_func(q, k, v, causal=True)
    if mask == "alibi":
        return lambda q, k, v: flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    if mask == "softcap":
        return lambda q, k, v: flash_attn_func(q, k, v, causal=True, softcap=SOFTCAP)
    return None


def _sweep(q, k, v, block_mask, mask: str) -> list[dict]:
    """Time flashattn2's flex kernels alone over SWEEP's configs (one kernel's override at a time)."""
    rows = []
    bits = flashattn2.flex._mask_bits(block_mask, TOKENS, TOKENS)
    scale = HDIM ** -0.5
    out, lse = flex_kernels.flex_forward(q, k, v, block_mask, scale, bits[:2])
    dout = torch.randn_like(out)
    for kernel, configs in SWEEP.items():
        for cfg in configs:
            flex_kernels.OVERRIDE.clear()
            flex_kernels.OVERRIDE[kernel] = cfg
            try:
                if kernel == "fwd":
                    ms = triton.testing.do_bench(lambda: flex_kernels.flex_forward(q, k, v, block_mask, scale,
                                                                                   bits[:2]),
                                                 warmup=10, rep=50, return_mode="median")
                else:
                    ms = triton.testing.do_bench(lambda: flex_kernels.flex_backward(
                        dout, q, k, v, out, lse, block_mask, scale, bits[:2], bits[2]), warmup=10, rep=50,
                        return_mode="median")
            except Exception as e:  # a config that does not fit (shared memory) is reported, not fatal
                ms = float("nan")
                print(f"  {kernel} {cfg}: {type(e).__name__}: {str(e)[:100]}")
            rows.append(dict(mask=mask, kernel=kernel, config=cfg, ms=ms))
            print(f"sweep {mask:10s} {kernel:5s} {str(cfg):18s} {ms:8.3f} ms", flush=True)
    flex_kernels.OVERRIDE.clear()
    return rows


def _run_mask(mask: str, q, k, v, compiled) -> list[dict]:
    """Flex, flashattn2's flex and flash_attn_func (where it expresses the mask) on one mask: a row each."""
    (mask_mod, score_mod), slopes = _mods(mask)
    t0 = time.perf_counter()
    block_mask = create_block_mask(mask_mod, None, None, TOKENS, TOKENS, device=DEVICE)
    torch.cuda.synchronize()
    t_mask = time.perf_counter() - t0
    pairs = _pairs(block_mask)
    flops = 4 * HEADS * HDIM * pairs
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    timings = {"flex": time_fwd_bwd(lambda: compiled(*leaves, score_mod=score_mod, block_mask=block_mask),
                                    leaves, warmup=25, rep=100)}
    # flashattn2's flex, a score_mod (ALiBi, softcap) compiled in
    flashattn2.flex._bits.clear()
    t0 = time.perf_counter()
    flashattn2.flex._mask_bits(block_mask, TOKENS, TOKENS)
    torch.cuda.synchronize()
    extra = dict(mask_bits_s=time.perf_counter() - t0, block_mask_s=t_mask)
    for backend in BACKENDS:
        flashattn2.set_backend(backend)
        name = "flashattn2-flex" + ("" if backend == "auto" else f"-{backend}")
        timings[name] = time_fwd_bwd(lambda: flashattn2.flex_attention(*leaves, score_mod=score_mod,
                                                                       block_mask=block_mask),
                                     leaves, warmup=25, rep=100)
    flashattn2.set_backend("auto")
    with torch.no_grad():  # a sanity check at full size: the largest difference to Flex's output
        extra["max_diff_to_flex"] = (
            flashattn2.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask).float()
            - compiled(q, k, v, score_mod=score_mod, block_mask=block_mask).float()).abs().max().item()
    print(f"{mask:12s} {extra}", flush=True)
    dense = _ours_dense(mask, slopes)
    if dense is not None:
        dense_leaves = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
        timings["flash_attn_func"] = time_fwd_bwd(lambda: dense(*dense_leaves), dense_leaves, warmup=25, rep=100)
    rows = []
    for name, (fwd, bwd) in timings.items():
        row = dict(mask=mask, impl=name, fwd_ms=fwd, bwd_ms=bwd, fwd_tflops=flops / fwd / 1e9,
                   bwd_tflops=2.5 * flops / bwd / 1e9, density=pairs / TOKENS ** 2)
        if name.startswith("flashattn2-flex"):
            row.update(extra, backend=flex_forward_backend(q, k, v, block_mask) if name == "flashattn2-flex"
                       else None)
        rows.append(row)
        print(f"{mask:12s} {name:16s} fwd {row['fwd_tflops']:6.1f}  bwd {row['bwd_tflops']:6.1f} TFLOP/s "
              f"({fwd:.3f} / {bwd:.3f} ms)", flush=True)
    return rows


def _save(args, rows: list[dict], sweep: list[dict]) -> None:
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d"), tokens=TOKENS, heads=HEADS, head_dim=HDIM, dtype=str(DTYPE),
                window=WINDOW, docs=DOCS,
                prefix=PREFIX, density=DENSITY, softcap=SOFTCAP, flex_configs=flex_kernels.CONFIGS)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / f"{args.stem}.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows, sweep=sweep), f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--stem", default=f"{time.strftime('%Y-%m-%d')}_flex")
    ap.add_argument("--masks", nargs="+", default=list(MASKS), choices=MASKS)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--backends", nargs="+", default=["auto"], choices=["auto", "gluon", "triton"])
    ap.add_argument("--head-dim", type=int, default=128, choices=[64, 128, 256])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = ap.parse_args()
    global HEADS, HDIM, DTYPE
    HDIM, HEADS, DTYPE = args.head_dim, 2048 // args.head_dim, getattr(torch, args.dtype)
    BACKENDS[:] = args.backends
    # Flex's compiled backward donates buffers, which forbids the retain_graph=True the timing loop needs
    torch._functorch.config.donated_buffer = False
    # every mask is a new mask_mod closure, a recompile each: past the default limit Flex falls back to eager
    torch._dynamo.config.recompile_limit = 64
    torch.manual_seed(0)
    # Flex's layout (batch, heads, seqlen, dim); flash_attn_func gets transposed copies
    q, k, v = (torch.randn(1, HEADS, TOKENS, HDIM, device=DEVICE, dtype=DTYPE) for _ in range(3))
    compiled = torch.compile(flex_attention)
    rows, sweep = [], []
    for mask in args.masks:
        rows += _run_mask(mask, q, k, v, compiled)
        if args.sweep and mask in ("causal", "documents"):
            mask_mod = _mods(mask)[0][0]
            sweep += _sweep(q, k, v, create_block_mask(mask_mod, None, None, TOKENS, TOKENS, device=DEVICE), mask)
        _save(args, rows, sweep)  # after every mask, so that a cut run keeps what it measured
    assert not math.isnan(sum(r["fwd_ms"] for r in rows))


if __name__ == "__main__":
    main()
