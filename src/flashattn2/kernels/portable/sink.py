"""Attention sinks on a finished call (sinks.py's math) in one pass each way: the forward's fold rescales out in
place and writes the sink-inclusive lse; the backward's sink gradient reads dout and out once. Both take dense
(batch, seqlen, heads, dim) / (batch, heads, seqlen) or packed (total, heads, dim) / (heads, total) tensors as a
(batch, rows) walk with strides (packed: one batch of `total` rows)."""

import torch
import triton
import triton.language as tl

from ..common import INTERPRET, LOG2E, cdiv, load_rows, padded_head_dim, round_to, store_rows

BLOCK_ROWS = 64


@triton.jit
def _row_block(Out, stride_o, nheads, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's rows of one (batch, head): (batch, head, rows, columns, Out's pointers to them)."""
    off_b = (tl.program_id(1) // nheads).to(tl.int64)
    off_h = (tl.program_id(1) % nheads).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = Out + off_b * stride_o[0] + off_h * stride_o[2] + offs_m[:, None].to(tl.int64) * stride_o[1] \
        + offs_d[None, :]
    return off_b, off_h, offs_m, offs_d, ptrs


@triton.jit
def sink_fold_kernel(Out, Lse, Sink, stride_o, stride_lse, nheads, rows, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, INTERPRET: tl.constexpr):
    """out *= exp(lse0 - L), lse = L = logaddexp(lse0, sink[h]), in place (lse0 +inf: a row without keys)."""
    off_b, off_h, offs_m, offs_d, o_ptrs = _row_block(Out, stride_o, nheads, BLOCK_M, BLOCK_D)
    lse_ptrs = Lse + off_b * stride_lse[0] + off_h * stride_lse[1] + offs_m
    lse0 = tl.load(lse_ptrs, mask=offs_m < rows, other=float("-inf"))
    lse0 = tl.where(lse0 == float("inf"), float("-inf"), lse0)
    sink = tl.load(Sink + off_h).to(tl.float32)
    top = tl.maximum(lse0, sink)  # finite: the sink is
    total = top + tl.log(tl.exp(lse0 - top) + tl.exp(sink - top))
    factor = tl.exp(lse0 - total)
    out = load_rows(o_ptrs, offs_m, rows, offs_d, HEAD_DIM, BLOCK_D, True).to(tl.float32)
    store_rows(o_ptrs, round_to(out * factor[:, None], Out.dtype.element_ty, INTERPRET), offs_m, rows, offs_d,
               HEAD_DIM, BLOCK_D)
    tl.store(lse_ptrs, total, mask=offs_m < rows)


@triton.jit
def sink_grad_kernel(dOut, Out, Lse, Sink, Partial, stride_do, stride_o, stride_lse, nheads, rows,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """Partial[h, b, block] = -sum over the block's rows of exp(sink[h] - lse) * rowsum(dout * out)."""
    off_b, off_h, offs_m, offs_d, o_ptrs = _row_block(Out, stride_o, nheads, BLOCK_M, BLOCK_D)
    _, _, _, _, do_ptrs = _row_block(dOut, stride_do, nheads, BLOCK_M, BLOCK_D)
    do = load_rows(do_ptrs, offs_m, rows, offs_d, HEAD_DIM, BLOCK_D, True).to(tl.float32)
    o = load_rows(o_ptrs, offs_m, rows, offs_d, HEAD_DIM, BLOCK_D, True).to(tl.float32)
    lse = tl.load(Lse + off_b * stride_lse[0] + off_h * stride_lse[1] + offs_m, mask=offs_m < rows,
                  other=float("inf"))
    p_sink = tl.math.exp2((tl.load(Sink + off_h).to(tl.float32) - lse) * LOG2E)
    partial = -tl.sum(p_sink * tl.sum(do * o, 1), 0)
    tl.store(Partial + (off_h * tl.num_programs(1) // nheads + off_b) * tl.num_programs(0) + tl.program_id(0),
             partial)


def _walk(out: torch.Tensor, lse: torch.Tensor, varlen: bool):
    """(batch, rows, heads, head dim, out's (batch, row, head) strides, lse's (batch, head) strides)."""
    if varlen:
        total, nheads, head_dim = out.shape
        return 1, total, nheads, head_dim, (0, out.stride(0), out.stride(1)), (0, lse.stride(0))
    batch, seqlen, nheads, head_dim = out.shape
    return batch, seqlen, nheads, head_dim, out.stride()[:3], lse.stride()[:2]


def fold(out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor, varlen: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """sinks.fold's result, computed in place on a call's own (out, lse) (unit last stride)."""
    batch, rows, nheads, head_dim, stride_o, stride_lse = _walk(out, lse, varlen)
    if out.numel():
        block = 32 if INTERPRET else BLOCK_ROWS
        sink_fold_kernel[(cdiv(rows, block), batch * nheads, 1)](
            out, lse, sink, stride_o, stride_lse, nheads, rows, HEAD_DIM=head_dim,
            BLOCK_D=padded_head_dim(head_dim), BLOCK_M=block, INTERPRET=INTERPRET, num_warps=4)
    return out, lse


def sink_grad(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor,
              varlen: bool) -> torch.Tensor:
    """sinks.sink_grad in one pass over dout and out (deterministic: per-block sums, then one torch sum)."""
    batch, rows, nheads, head_dim, stride_o, stride_lse = _walk(out, lse, varlen)
    block = 32 if INTERPRET else BLOCK_ROWS
    blocks = cdiv(rows, block)
    partial = torch.zeros((nheads, batch, max(blocks, 1)), dtype=torch.float32, device=out.device)
    if out.numel():
        stride_do = (0, dout.stride(0), dout.stride(1)) if varlen else dout.stride()[:3]
        sink_grad_kernel[(blocks, batch * nheads, 1)](
            dout, out, lse, sink, partial, stride_do, stride_o, stride_lse, nheads, rows, HEAD_DIM=head_dim,
            BLOCK_D=padded_head_dim(head_dim), BLOCK_M=block, num_warps=4)
    return partial.sum((1, 2)).to(sink.dtype)
