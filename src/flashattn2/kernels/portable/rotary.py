"""Rotary position embedding on the first rotary_dim channels of (batch, seqlen, heads, dim) or packed
(total, heads, dim) tensors, at positions shifted per sequence (the KV-cache case).

Non-interleaved (GPT-NeoX) pairs channel i with i + rotary_dim / 2, interleaved (GPT-J) pairs 2i with
2i + 1; both rotate by (cos, sin) of the position's row. Positions past the tables' end are left as
they are. The rotation is computed in fp32 and rounded once.
"""

import torch
import triton
import triton.language as tl

from ..common import cdiv


@triton.jit
def rotary_kernel(
    X, Out, Cos, Sin, CuSeqlens, Offsets,
    stride_xb, stride_xm, stride_xh, stride_ob, stride_om, stride_oh, stride_cm,
    seqlen, seqlen_ro, offset,
    HALF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, INTERLEAVED: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_OFFSETS: tl.constexpr, CONJUGATE: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    off_b = tl.program_id(1)
    off_h = tl.program_id(2).to(tl.int64)
    if IS_VARLEN:
        row0 = tl.load(CuSeqlens + off_b)
        seqlen = tl.load(CuSeqlens + off_b + 1) - row0
        base_b = row0.to(tl.int64) * stride_xm
        out_b = row0.to(tl.int64) * stride_om
    else:
        base_b = off_b.to(tl.int64) * stride_xb
        out_b = off_b.to(tl.int64) * stride_ob
    if start_m >= seqlen:
        return
    if HAS_OFFSETS:
        offset = tl.load(Offsets + off_b)
    rows = start_m + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    pos = rows + offset
    row_ok = rows < seqlen
    tab_mask = (pos[:, None] < seqlen_ro) & (pos[:, None] >= 0) & (ks[None, :] < HALF)
    # past the tables: cos 1, sin 0, the channels pass through
    cos = tl.load(Cos + pos[:, None] * stride_cm + ks[None, :], mask=tab_mask, other=1.0).to(tl.float32)
    sin = tl.load(Sin + pos[:, None] * stride_cm + ks[None, :], mask=tab_mask, other=0.0).to(tl.float32)
    if CONJUGATE:
        sin = -sin  # the inverse rotation: the backward
    if INTERLEAVED:
        first, second = 2 * ks, 2 * ks + 1
    else:
        first, second = ks, ks + HALF
    mask = row_ok[:, None] & (ks[None, :] < HALF)
    x_rows = X + base_b + off_h * stride_xh + rows[:, None].to(tl.int64) * stride_xm
    o_rows = Out + out_b + off_h * stride_oh + rows[:, None].to(tl.int64) * stride_om
    x1 = tl.load(x_rows + first[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_rows + second[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(o_rows + first[None, :], (x1 * cos - x2 * sin).to(Out.dtype.element_ty), mask=mask)
    tl.store(o_rows + second[None, :], (x1 * sin + x2 * cos).to(Out.dtype.element_ty), mask=mask)


def rotary(x: torch.Tensor, out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
           offsets: torch.Tensor | int, cu_seqlens: torch.Tensor | None, max_seqlen: int | None,
           conjugate: bool = False) -> None:
    """Launch on checked tensors; out may be x (in place). Channels past rotary_dim are not touched."""
    varlen = cu_seqlens is not None
    if varlen:
        batch, seqlen, nheads = cu_seqlens.shape[0] - 1, max_seqlen, x.shape[1]
        sx, so = (0, *x.stride()[:2]), (0, *out.stride()[:2])
    else:
        batch, seqlen, nheads = x.shape[0], x.shape[1], x.shape[2]
        sx, so = x.stride()[:3], out.stride()[:3]
    if batch * seqlen * nheads == 0:
        return
    half = cos.shape[1]
    block_m = 16
    has_offsets = isinstance(offsets, torch.Tensor)
    rotary_kernel[(cdiv(seqlen, block_m), batch, nheads)](
        x, out, cos, sin, cu_seqlens, offsets if has_offsets else None,
        *sx, *so, cos.stride(0), seqlen, cos.shape[0], 0 if has_offsets else int(offsets),
        HALF=half, BLOCK_M=block_m, BLOCK_K=max(triton.next_power_of_2(half), 1), INTERLEAVED=interleaved,
        IS_VARLEN=varlen, HAS_OFFSETS=has_offsets, CONJUGATE=conjugate, num_warps=4,
    )
