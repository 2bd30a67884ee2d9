"""Merging attention computed over disjoint parts of the keys (split-KV decoding, context parallelism):
out = sum_i w_i out_i / sum_i w_i and lse = log(sum_i exp(lse_i)), with w_i = exp(lse_i - max_j lse_j).

A part whose lse is -inf saw no key and weighs nothing. +inf counts as empty too: it is what the
attention functions write for a row that sees no key, so their outputs merge without a conversion.
A row whose every part is empty gives out 0 and lse -inf, the neutral element of the merge.
"""

import torch
import triton
import triton.language as tl

from ..common import INTERPRET, cdiv, padded_head_dim, round_to
from ..launch import Launch


@triton.jit
def _part_lse(lse_ptr):
    lse = tl.load(lse_ptr)
    return tl.where(lse == float("inf"), float("-inf"), lse)


@triton.jit
def combine_kernel(
    OutP, LseP, Out, Lse, Sink, stride_out_part, stride_lse_part, stride_out, stride_lse,
    n_splits, n_rows, seqlen, nheads, empty_lse,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, INTERPRET: tl.constexpr = False,
):
    """One program per BLOCK_R rows of (batch, seqlen, heads); two passes over the parts (max, then sum).
    Strides: the parts' (split, batch, row, head), the outputs' (batch, row, head). Sink: None, or (nheads,)
    learnable sinks, one more part per row with lse sink[h] and no value (sinks.py)."""
    stride_ps, stride_pb, stride_pm, stride_ph = stride_out_part
    stride_ls, stride_lb, stride_lm, stride_lh = stride_lse_part
    stride_ob, stride_om, stride_oh = stride_out
    stride_Lb, stride_Lm, stride_Lh = stride_lse
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = rows < n_rows
    rows = tl.where(valid, rows, 0)  # out-of-range rows read row 0 and are never stored
    off_b = rows // (seqlen * nheads)
    off_m = (rows // nheads) % seqlen
    off_h = rows % nheads
    cols = tl.arange(0, BLOCK_D)
    lse_row = LseP + off_b * stride_lb + off_m * stride_lm + off_h * stride_lh
    part_row = OutP + off_b * stride_pb + off_m * stride_pm + off_h * stride_ph
    mx = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for i in range(n_splits):
        mx = tl.maximum(mx, _part_lse(lse_row + i * stride_ls))
    if Sink is not None:
        sink = tl.load(Sink + off_h).to(tl.float32)
        mx = tl.maximum(mx, sink)
    shift = tl.where(mx == float("-inf"), 0.0, mx)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    den = tl.zeros([BLOCK_R], tl.float32)
    col_ok = cols[None, :] < HEAD_DIM
    for i in range(n_splits):
        w = tl.exp(_part_lse(lse_row + i * stride_ls) - shift)
        part = tl.load(part_row[:, None] + i * stride_ps + cols[None, :], mask=col_ok, other=0.0)
        # an empty part's output may hold anything (even NaN): it must not reach the sum
        acc += tl.where(w[:, None] > 0.0, w[:, None] * part, 0.0)
        den += w
    if Sink is not None:
        den += tl.exp(sink - shift)
    empty = den == 0.0
    out = acc / tl.where(empty, 1.0, den)[:, None]
    lse = tl.where(empty, empty_lse, shift + tl.log(tl.where(empty, 1.0, den)))
    out_row = Out + off_b * stride_ob + off_m * stride_om + off_h * stride_oh
    # round_to: the interpreter's own cast to bf16 truncates (a one-ulp bias the pass rule caught)
    tl.store(out_row[:, None] + cols[None, :], round_to(out, Out.dtype.element_ty, INTERPRET),
             mask=valid[:, None] & col_ok)
    tl.store(Lse + off_b * stride_Lb + off_m * stride_Lm + off_h * stride_Lh, lse, mask=valid)


def combine_launch(partial_shape: tuple, out_strides: tuple, lse_strides: tuple,
                   empty_lse: float = float("-inf")) -> Launch | None:
    """The merge of contiguous partials of partial_shape (splits, batch, seqlen, heads, dim) into out and lse
    with the given (batch, seqlen, heads) strides, as a Launch(out_partial, lse_partial, out, lse, sink or None);
    None when there is nothing to merge. empty_lse is the lse of a row whose every part is empty."""
    n_splits, batch, seqlen, nheads, head_dim = partial_shape
    n_rows = batch * seqlen * nheads
    if n_rows == 0:
        return None
    block_r = 16
    sp = (seqlen * nheads * head_dim, nheads * head_dim, head_dim)
    partial = (batch * sp[0], *sp, batch * seqlen * nheads, seqlen * nheads, nheads, 1)
    return Launch(combine_kernel, (cdiv(n_rows, block_r), 1, 1), (),
                  dict(stride_out_part=partial[:4], stride_lse_part=partial[4:], stride_out=tuple(out_strides[:3]),
                       stride_lse=tuple(lse_strides), n_splits=n_splits, n_rows=n_rows, seqlen=seqlen, nheads=nheads,
                       empty_lse=empty_lse, HEAD_DIM=head_dim, BLOCK_D=padded_head_dim(head_dim), BLOCK_R=block_r,
                       INTERPRET=INTERPRET),
                  4, 1)


def combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
            empty_lse: float = float("-inf")) -> None:
    """Launch the merge on checked tensors: out (batch, seqlen, heads, dim), lse (batch, seqlen, heads)."""
    n_splits, batch, seqlen, nheads, head_dim = out_partial.shape
    n_rows = batch * seqlen * nheads
    if n_rows == 0:
        return
    block_r = 16
    combine_kernel[(cdiv(n_rows, block_r),)](
        out_partial, lse_partial, out, lse, None, out_partial.stride()[:4], lse_partial.stride(), out.stride()[:3],
        lse.stride(), n_splits, n_rows, seqlen, nheads, empty_lse,
        HEAD_DIM=head_dim, BLOCK_D=padded_head_dim(head_dim), BLOCK_R=block_r, INTERPRET=INTERPRET, num_warps=4,
    )
