"""FlashAttention-2 backward (section 3.1.2).

1. preprocess: Delta = rowsum(dO * O), one fp32 per query row.
2. dK/dV: one program per (key tile, batch x kv-head) keeps K, V and the dK, dV accumulators on chip
   and loops over the query heads of its group and their query tiles, recomputing P from the stored
   log-sum-exp. With ATOMIC_DQ it also adds dS K into an fp32 dQ buffer.
3. dQ (the deterministic path, no atomics): one program per (query tile, batch x head) loops over key
   tiles and recomputes P and dP.
"""

import math

import torch
import triton
import triton.language as tl

from . import common
from .block_range import kv_range_for_q_tile, q_range_for_kv_tile
from .common import INTERPRET, LOG2E, load_rows, mma, padded_head_dim, round_to, store_rows
from .configs import BwdConfig, bwd_config
from .mask import score_mask

_LOG2E = math.log2(math.e)


@triton.jit
def bwd_preprocess_kernel(
    Out, dOut, Delta,
    stride_ob, stride_om, stride_oh, stride_dob, stride_dom, stride_doh,
    nheads, seqlen_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d], the row term of dS = P * (dP - Delta)."""
    start_m = tl.program_id(0) * BLOCK_M
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // nheads).to(tl.int64)
    off_h = (pid_bh % nheads).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = load_rows(Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                  offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D, True)
    do = load_rows(dOut + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                   + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + pid_bh.to(tl.int64) * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _dkdv_from_q_tiles(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base,
                       stride_qm, stride_dom, stride_dqm, offs_n, offs_d,
                       m_lo, m_hi, seqlen_q, seqlen_k, qk_scale, softmax_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                       IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                       INTERPRET: tl.constexpr):
    """Accumulate dK, dV of one key tile over query tiles [m_lo, m_hi), working on transposed scores
    (keys x queries) so that P^T and dS^T feed the dV and dK matmuls without a transpose."""
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in tl.range(m_lo, m_hi, BLOCK_M):
        offs_m = start_m + offs_m0
        q = load_rows(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], offs_m, seqlen_q, offs_d,
                      HEAD_DIM, BLOCK_D, True)
        # rows past seqlen_q load lse = +inf, which makes their probabilities exactly 0
        lse = tl.load(lse_base + offs_m, mask=offs_m < seqlen_q, other=float("inf")) * LOG2E
        qkT = mma(k, tl.trans(q), None, INTERPRET)
        if MASKED:
            visible = score_mask(offs_m[None, :], offs_n[:, None], seqlen_q, seqlen_k, IS_CAUSAL)
            qkT = tl.where(visible, qkT, float("-inf"))
        pT = tl.math.exp2(qkT * qk_scale - lse[None, :])
        do = load_rows(do_base + offs_m[:, None] * stride_dom + offs_d[None, :], offs_m, seqlen_q, offs_d,
                       HEAD_DIM, BLOCK_D, True)
        dv = mma(round_to(pT, do.dtype, INTERPRET), do, dv, INTERPRET)
        delta = tl.load(delta_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
        dpT = mma(v, tl.trans(do), None, INTERPRET)
        dsT = round_to(pT * (dpT - delta[None, :]), q.dtype, INTERPRET)
        dk = mma(dsT, q, dk, INTERPRET)
        if ATOMIC_DQ:
            dq = mma(tl.trans(dsT), k, None, INTERPRET) * softmax_scale
            dq_mask = offs_m[:, None] < seqlen_q
            if HEAD_DIM != BLOCK_D:
                dq_mask = dq_mask & (offs_d[None, :] < HEAD_DIM)
            tl.atomic_add(dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :], dq, mask=dq_mask,
                          sem="relaxed")
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, dOut, Lse, Delta, dQ, dK, dV,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh,
    nheads, nheads_k, seqlen_q, seqlen_k, qk_scale, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, INTERPRET: tl.constexpr,
):
    """dK and dV for one key tile of one kv head, summed over the query heads that share it (GQA)."""
    start_n = tl.program_id(0) * BLOCK_N
    pid_bhk = tl.program_id(1)
    off_b = (pid_bhk // nheads_k).to(tl.int64)
    off_hk = (pid_bhk % nheads_k).to(tl.int64)
    group = nheads // nheads_k

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_rows(K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                  offs_n, seqlen_k, offs_d, HEAD_DIM, BLOCK_D, True)
    v = load_rows(V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                  offs_n, seqlen_k, offs_d, HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    m_begin, m_masked_end, m_end = q_range_for_kv_tile(start_n, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N,
                                                       IS_CAUSAL)
    for off_h in range(off_hk * group, off_hk * group + group):
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = dOut + off_b * stride_dob + off_h * stride_doh
        dq_base = dQ + off_b * stride_dqb + off_h * stride_dqh
        row_base = (off_b * nheads + off_h) * seqlen_q
        # query tiles that the diagonal or a sequence end crosses, then those that see the whole tile
        dk, dv = _dkdv_from_q_tiles(dk, dv, k, v, q_base, do_base, dq_base, Lse + row_base, Delta + row_base,
                                    stride_qm, stride_dom, stride_dqm, offs_n, offs_d,
                                    m_begin, m_masked_end, seqlen_q, seqlen_k, qk_scale, softmax_scale,
                                    HEAD_DIM, BLOCK_D, BLOCK_M, IS_CAUSAL, True, ATOMIC_DQ, INTERPRET)
        dk, dv = _dkdv_from_q_tiles(dk, dv, k, v, q_base, do_base, dq_base, Lse + row_base, Delta + row_base,
                                    stride_qm, stride_dom, stride_dqm, offs_n, offs_d,
                                    m_masked_end, m_end, seqlen_q, seqlen_k, qk_scale, softmax_scale,
                                    HEAD_DIM, BLOCK_D, BLOCK_M, IS_CAUSAL, False, ATOMIC_DQ, INTERPRET)

    # dK = scale * dS^T Q: the softmax scale is applied once, here
    store_rows(dK + off_b * stride_dkb + off_hk * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
               round_to(dk * softmax_scale, dK.dtype.element_ty, INTERPRET),
               offs_n, seqlen_k, offs_d, HEAD_DIM, BLOCK_D)
    store_rows(dV + off_b * stride_dvb + off_hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
               round_to(dv, dV.dtype.element_ty, INTERPRET), offs_n, seqlen_k, offs_d, HEAD_DIM, BLOCK_D)


@triton.jit
def _dq_from_kv_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                      n_lo, n_hi, seqlen_q, seqlen_k, qk_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                      IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, INTERPRET: tl.constexpr):
    """Accumulate dQ of one query tile over key tiles [n_lo, n_hi)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(n_lo, n_hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = load_rows(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, seqlen_k, offs_d,
                      HEAD_DIM, BLOCK_D, MASKED)
        v = load_rows(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], offs_n, seqlen_k, offs_d,
                      HEAD_DIM, BLOCK_D, MASKED)
        qk = mma(q, tl.trans(k), None, INTERPRET)
        if MASKED:
            visible = score_mask(offs_m[:, None], offs_n[None, :], seqlen_q, seqlen_k, IS_CAUSAL)
            qk = tl.where(visible, qk, float("-inf"))
        p = tl.math.exp2(qk * qk_scale - lse[:, None])
        dp = mma(do, tl.trans(v), None, INTERPRET)
        ds = round_to(p * (dp - delta[:, None]), k.dtype, INTERPRET)
        dq = mma(ds, k, dq, INTERPRET)
    return dq


@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, dOut, Lse, Delta, dQ,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    nheads, group, seqlen_q, seqlen_k, qk_scale, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, INTERPRET: tl.constexpr,
):
    """dQ for one query tile: no atomics, so it is bitwise reproducible."""
    start_m = tl.program_id(0) * BLOCK_M
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // nheads).to(tl.int64)
    off_h = pid_bh % nheads
    off_hk = (off_h // group).to(tl.int64)
    off_h = off_h.to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                  offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D, True)
    do = load_rows(dOut + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                   + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D, True)
    row_base = pid_bh.to(tl.int64) * seqlen_q
    lse = tl.load(Lse + row_base + offs_m, mask=offs_m < seqlen_q, other=float("inf")) * LOG2E
    delta = tl.load(Delta + row_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    n_full, n_end = kv_range_for_q_tile(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dq = _dq_from_kv_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                           0, n_full, seqlen_q, seqlen_k, qk_scale,
                           HEAD_DIM, BLOCK_D, BLOCK_N, IS_CAUSAL, False, INTERPRET)
    dq = _dq_from_kv_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                           n_full, n_end, seqlen_q, seqlen_k, qk_scale,
                           HEAD_DIM, BLOCK_D, BLOCK_N, IS_CAUSAL, True, INTERPRET)
    store_rows(dQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :],
               round_to(dq * softmax_scale, dQ.dtype.element_ty, INTERPRET),
               offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D)


def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       out: torch.Tensor, lse: torch.Tensor, softmax_scale: float, causal: bool,
                       deterministic: bool, config: BwdConfig | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernels; returns (dq, dk, dv) shaped like q, k, v."""
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    block_d = padded_head_dim(head_dim)
    cfg = config or bwd_config(block_d, causal, q.device)
    atomic_dq = cfg.atomic_dq and not deterministic
    qk_scale = softmax_scale * _LOG2E
    if q.numel() == 0 or k.numel() == 0:
        # nothing to attend to (or nobody attending): every gradient is zero
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    delta = common.empty((batch, nheads, seqlen_q), torch.float32, q.device)
    pre_block = 64 if not INTERPRET else 32
    bwd_preprocess_kernel[(triton.cdiv(seqlen_q, pre_block), batch * nheads)](
        out, dout, delta,
        out.stride(0), out.stride(1), out.stride(2), dout.stride(0), dout.stride(1), dout.stride(2),
        nheads, seqlen_q, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=pre_block,
    )

    dk = common.empty(k.shape, k.dtype, k.device)
    dv = common.empty(v.shape, v.dtype, v.device)
    # fp32 accumulation buffer for the atomic path; the dQ kernel writes dq directly
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if atomic_dq else \
        common.empty(q.shape, q.dtype, q.device)
    attention_bwd_dkdv_kernel[(triton.cdiv(seqlen_k, cfg.block_n), batch * nheads_k)](
        q, k, v, dout, lse, delta, dq_acc, dk, dv,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2),
        dq_acc.stride(0), dq_acc.stride(1), dq_acc.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2),
        nheads, nheads_k, seqlen_q, seqlen_k, qk_scale, softmax_scale,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        IS_CAUSAL=causal, ATOMIC_DQ=atomic_dq, INTERPRET=INTERPRET,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if atomic_dq:
        return dq_acc.to(q.dtype), dk, dv

    dq = dq_acc
    attention_bwd_dq_kernel[(triton.cdiv(seqlen_q, cfg.dq_block_m), batch * nheads)](
        q, k, v, dout, lse, delta, dq,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        nheads, nheads // nheads_k, seqlen_q, seqlen_k, qk_scale, softmax_scale,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=cfg.dq_block_m, BLOCK_N=cfg.dq_block_n,
        IS_CAUSAL=causal, INTERPRET=INTERPRET,
        num_warps=cfg.dq_num_warps, num_stages=cfg.dq_num_stages,
    )
    return dq, dk, dv
