"""FP8's V stored keys-last: FP8 tensor cores read the P V matmul's V along the keys (K-major), so the FP8
forwards take V as (batch, heads, head_dim, keys) storage, copied once per call by this kernel.

A torch permute-copy of the 1-byte elements took 160-190 µs for 32 MB on the H100, most of a 1k call's gain
(benchmarks/NOTES.md); this kernel loads (keys, head_dim) tiles along the head dim and stores them transposed
along the keys, in about 30 µs. Keys past the sequence, up to the padded length, are written as zeros.
"""

import torch
import triton
import triton.language as tl

from .common import cdiv, padded_head_dim


@triton.jit
def v_keys_last_kernel(V, Out, seqlen, keys, stride_vb, stride_vs, stride_vh, stride_vd,
                       HEAD_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    off_h = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    src = (V + off_b * stride_vb + off_h * stride_vh + offs_k[:, None].to(tl.int64) * stride_vs
           + offs_d[None, :] * stride_vd)
    tile = tl.load(src, mask=(offs_k[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM), other=0)
    nheads = tl.num_programs(1)
    row0 = (off_b * nheads + off_h) * HEAD_DIM  # this (batch, head)'s first channel row of Out
    dst = Out + (row0 + offs_d[:, None]) * keys + offs_k[None, :]
    tl.store(dst, tl.trans(tile), mask=(offs_d[:, None] < HEAD_DIM) & (offs_k[None, :] < keys))


def v_keys_last(v: torch.Tensor, multiple: int = 16) -> torch.Tensor:
    """Dense v (batch, seqlen, heads, head_dim) as a new (batch, heads, head_dim, keys) tensor, or packed v
    (total, heads, head_dim) as (heads, head_dim, keys), keys = the length rounded up to `multiple` (zeros
    past it)."""
    dense = v.dim() == 4
    batch, seqlen, heads, head_dim = v.shape if dense else (1, *v.shape)
    keys = cdiv(seqlen, multiple) * multiple
    out = torch.empty((batch, heads, head_dim, keys), dtype=torch.uint8, device=v.device)
    if out.numel():
        src = v.view(torch.uint8)  # the copy moves bytes; the interpreter has no fp8 loads
        stride_vb, stride_vs, stride_vh, stride_vd = src.stride() if dense else (0, *src.stride())
        block_k = 128
        v_keys_last_kernel[(cdiv(keys, block_k), heads, batch)](
            src, out, seqlen, keys, stride_vb, stride_vs, stride_vh, stride_vd, HEAD_DIM=head_dim, BLOCK_K=block_k,
            BLOCK_D=padded_head_dim(head_dim), num_warps=4)
    out = out.view(v.dtype)
    return out if dense else out[0]
