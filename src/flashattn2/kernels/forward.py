"""FlashAttention-2 forward: one program per (query tile, batch x head), looping over key tiles."""

import math

import torch
import triton
import triton.language as tl

from . import common
from .block_range import kv_range_for_q_tile
from .common import INTERPRET, load_rows, mma, padded_head_dim, round_to, store_rows
from .configs import FwdConfig, fwd_config
from .mask import score_mask
from .softmax import finalize, online_softmax_update

_LOG2E = math.log2(math.e)


@triton.jit
def _attend_kv_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                     n_lo, n_hi, seqlen_q, seqlen_k, qk_scale,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                     INTERPRET: tl.constexpr):
    """Accumulate key tiles [n_lo, n_hi) into (acc, m_i, l_i); MASKED tiles check bounds and causality."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(n_lo, n_hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = load_rows(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, seqlen_k, offs_d,
                      HEAD_DIM, BLOCK_D, MASKED)
        qk = mma(q, tl.trans(k), None, INTERPRET)
        if MASKED:
            visible = score_mask(offs_m[:, None], offs_n[None, :], seqlen_q, seqlen_k, IS_CAUSAL)
            qk = tl.where(visible, qk, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_update(qk, m_i, l_i, qk_scale, MASKED)
        v = load_rows(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], offs_n, seqlen_k, offs_d,
                      HEAD_DIM, BLOCK_D, MASKED)
        acc = mma(round_to(p, v.dtype, INTERPRET), v, acc * alpha[:, None], INTERPRET)
    return acc, m_i, l_i


@triton.jit
def attention_fwd_kernel(
    Q, K, V, Out, Lse,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    nheads, group, seqlen_q, seqlen_k, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Out = softmax(Q K^T * scale) V and Lse = logsumexp of the scaled scores (natural log).

    qk_scale is softmax_scale * log2(e). Layouts are (batch, seqlen, heads, head_dim) with any strides
    but a unit last one; Lse is (batch, heads, seqlen_q). GQA: query head h reads key head h // group.
    """
    start_m = tl.program_id(0) * BLOCK_M
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // nheads).to(tl.int64)
    off_h = pid_bh % nheads
    off_hk = (off_h // group).to(tl.int64)
    off_h = off_h.to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    q = load_rows(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], offs_m, seqlen_q, offs_d,
                  HEAD_DIM, BLOCK_D, True)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    n_full, n_end = kv_range_for_q_tile(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    # tiles that every row sees whole: no mask arithmetic at all
    acc, m_i, l_i = _attend_kv_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                                     0, n_full, seqlen_q, seqlen_k, qk_scale,
                                     HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IS_CAUSAL, False, INTERPRET)
    # tiles crossed by the diagonal or by the end of the keys
    acc, m_i, l_i = _attend_kv_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                                     n_full, n_end, seqlen_q, seqlen_k, qk_scale,
                                     HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IS_CAUSAL, True, INTERPRET)

    out, lse = finalize(acc, m_i, l_i)
    o_base = Out + off_b * stride_ob + off_h * stride_oh
    store_rows(o_base + offs_m[:, None] * stride_om + offs_d[None, :],
               round_to(out, Out.dtype.element_ty, INTERPRET), offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D)
    tl.store(Lse + pid_bh.to(tl.int64) * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool,
                      config: FwdConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel on checked (batch, seqlen, heads, head_dim) inputs; returns (out, lse)."""
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    block_d = padded_head_dim(head_dim)
    cfg = config or fwd_config(block_d, causal, q.device)
    out = common.empty(q.shape, q.dtype, q.device)
    lse = common.empty((batch, nheads, seqlen_q), torch.float32, q.device)
    if out.numel() == 0:
        return out, lse
    grid = (triton.cdiv(seqlen_q, cfg.block_m), batch * nheads)
    attention_fwd_kernel[grid](
        q, k, v, out, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        nheads, nheads // nheads_k, seqlen_q, seqlen_k, softmax_scale * _LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        IS_CAUSAL=causal, INTERPRET=INTERPRET,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out, lse
