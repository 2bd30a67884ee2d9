"""FlashAttention-2 backward (section 3.1.2).

1. preprocess: Delta = rowsum(dO * O), one fp32 per query row.
2. dK/dV: one program per (key tile, batch x kv-head) keeps K, V and the dK, dV accumulators on chip
   and loops over the query heads of its group and their query tiles, recomputing P from the stored
   log-sum-exp (and the dropout mask from its seed). With ATOMIC_DQ it also adds dS K into an fp32 dQ
   buffer.
3. dQ (no atomics, so bitwise reproducible): one program per (query tile, batch x head) loops over
   key tiles and recomputes P and dP.

With s the final scores, dS = P * (dP - Delta); the softcap adds its derivative 1 - tanh^2, and the
softmax scale is applied once, when dQ and dK are stored.
"""

import torch
import triton
import triton.language as tl

from .. import common
from ..common import INTERPRET, LOG2E, cdiv, load_rows, long_rows, mma, padded_head_dim, round_to, store_rows
from ..device.block_range import kv_range_for_q_tile, q_range_for_kv_tile
from ..device.dropout import dropout_keep
from ..device.scores import alibi_slope_of, masked_scores, score_tail
from ..device.seqlen_info import ROW_COUNTS, program_problem
from ..device.tma import load_tile, tma_batch
from ..launch import Launch, PlanCache, align
from ..params import AttnOptions, lse_strides, problem_dims, row_strides
from ..tma import row_tiles, tma_usable
from .configs import BwdConfig, bwd_config


@triton.jit(do_not_specialize=ROW_COUNTS)
def bwd_preprocess_kernel(
    Out, dOut, Delta, DqAcc, CuSeqlensQ, Lse, Sink, DSink, stride_o, stride_do, stride_lse, stride_dq, nheads,
    seqlen_q, total_q, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, IS_VARLEN: tl.constexpr,
    ZERO_DQ: tl.constexpr, HEAD_DIM_V: tl.constexpr = 0, BLOCK_DV: tl.constexpr = 0,
):
    """Delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d], the row term of dS = P * (dP - Delta); with
    ZERO_DQ also zeroes the same rows of the fp32 dQ buffer that the fused Gluon backward adds into. O and dO have
    HEAD_DIM_V columns where it is given (MLA), dQ HEAD_DIM. With learnable sinks (Sink, None without), the sink's
    gradient -sum_i exp(sink[h] - Lse[b, h, i]) Delta[b, h, i] (sinks.py) is added into DSink[h] (fp32, zeroed by
    the caller); Lse is laid out like Delta."""
    DV: tl.constexpr = HEAD_DIM_V if HEAD_DIM_V > 0 else HEAD_DIM
    BDV: tl.constexpr = BLOCK_DV if BLOCK_DV > 0 else BLOCK_D
    stride_ob, stride_om, stride_oh = stride_o
    stride_dob, stride_dom, stride_doh = stride_do
    stride_dqb, stride_dqm, stride_dqh = stride_dq
    stride_lse_b, stride_lse_h = stride_lse
    start_m, off_b, off_h, q_start, seqlen_q, _, _ = program_problem(nheads, CuSeqlensQ, CuSeqlensQ, seqlen_q,
                                                                     seqlen_q, total_q, total_q, BLOCK_M, IS_VARLEN)
    if start_m >= seqlen_q:
        return
    off_b = off_b.to(tl.int64)
    off_h = off_h.to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BDV)
    rows = (q_start + offs_m[:, None]).to(tl.int64)
    o = load_rows(Out + off_b * stride_ob + off_h * stride_oh + rows * stride_om + offs_dv[None, :],
                  offs_m, seqlen_q, offs_dv, DV, BDV, True)
    do = load_rows(dOut + off_b * stride_dob + off_h * stride_doh + rows * stride_dom + offs_dv[None, :],
                   offs_m, seqlen_q, offs_dv, DV, BDV, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + off_b * stride_lse_b + off_h * stride_lse_h + q_start + offs_m, delta,
             mask=offs_m < seqlen_q)
    if Sink is not None:
        lse = tl.load(Lse + off_b * stride_lse_b + off_h * stride_lse_h + q_start + offs_m, mask=offs_m < seqlen_q,
                      other=float("inf"))
        p_sink = tl.exp(tl.load(Sink + off_h).to(tl.float32) - lse)  # 0 on rows past the end (lse +inf there)
        tl.atomic_add(DSink + off_h, -tl.sum(p_sink * delta, 0))
    if ZERO_DQ:
        store_rows(DqAcc + off_b * stride_dqb + off_h * stride_dqh + rows * stride_dqm + offs_d[None, :],
                   tl.zeros([BLOCK_M, BLOCK_D], tl.float32), offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D)


@triton.jit
def _dkdv_from_q_tiles(dk, dv, k, v, q_src, do_src, dq_dst, lse_base, delta_base, off_b, off_h, tma_row0,
                       stride_qm, stride_dom, stride_dqm, offs_n, offs_d, m_lo, m_hi,
                       seqlen_q, seqlen_k, qk_scale, softmax_scale, window_left, window_right,
                       softcap_in2, softcap_out, alibi_slope, seed, head_idx, dropout_p,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                       HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                       HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, MASKED: tl.constexpr,
                       ATOMIC_DQ: tl.constexpr, USE_TMA: tl.constexpr, TMA_DQ: tl.constexpr,
                       INTERPRET: tl.constexpr, offs_dv, DV: tl.constexpr, BDV: tl.constexpr):
    """Accumulate dK, dV of one key tile over query tiles [m_lo, m_hi), working on transposed scores
    (keys x queries) so that P^T and dS^T feed the dV and dK matmuls without a transpose. With USE_TMA, Q and
    dO tiles come from row tma_row0 + start_m of batch entry off_b (a packed batch: entry 0 from its sequence's
    first row; a dense one: its entry from row 0)."""
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in tl.range(m_lo, m_hi, BLOCK_M):
        offs_m = start_m + offs_m0
        q = load_tile(q_src, off_b, off_h, tma_row0 + start_m, offs_m, seqlen_q, stride_qm, offs_d, HEAD_DIM,
                      BLOCK_D, BLOCK_M, True, USE_TMA)
        # rows past seqlen_q load lse = +inf, which makes their probabilities exactly 0
        lse = tl.load(lse_base + offs_m, mask=offs_m < seqlen_q, other=float("inf")) * LOG2E
        sT, scale_log2, tanhT = score_tail(mma(k, tl.trans(q), None, INTERPRET), offs_m[None, :], offs_n[:, None],
                                           seqlen_q, seqlen_k, qk_scale, window_left, window_right, softcap_in2,
                                           softcap_out, alibi_slope, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI,
                                           MASKED)
        pT = tl.math.exp2(sT * scale_log2 - lse[None, :])
        do = load_tile(do_src, off_b, off_h, tma_row0 + start_m, offs_m, seqlen_q, stride_dom, offs_dv, DV,
                       BDV, BLOCK_M, True, USE_TMA)
        dpT = mma(v, tl.trans(do), None, INTERPRET)
        if HAS_DROPOUT:
            # the same bits as the forward: dV sees the dropped, rescaled P, dP flows back through them
            keepT = dropout_keep(seed, offs_m[None, :], offs_n[:, None], head_idx, dropout_p)
            rescale = 1.0 / (1.0 - dropout_p)
            dv = mma(round_to(tl.where(keepT, pT * rescale, 0.0), do.dtype, INTERPRET), do, dv, INTERPRET)
            dpT = tl.where(keepT, dpT * rescale, 0.0)
        else:
            dv = mma(round_to(pT, do.dtype, INTERPRET), do, dv, INTERPRET)
        delta = tl.load(delta_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
        dsT = pT * (dpT - delta[None, :])
        if HAS_SOFTCAP:
            dsT = dsT * (1.0 - tanhT * tanhT)
        dsT = round_to(dsT, q.dtype, INTERPRET)
        dk = mma(dsT, q, dk, INTERPRET)
        if ATOMIC_DQ:
            dq = mma(tl.trans(dsT), k, None, INTERPRET) * softmax_scale
            if TMA_DQ:
                # one bulk reduce-add of the tile into fp32 dQ in L2; the copy engine drops rows past seqlen
                dq_dst.atomic_add([off_b, start_m, off_h, 0], dq.reshape(1, BLOCK_M, 1, BLOCK_D))
            else:
                dq_mask = offs_m[:, None] < seqlen_q
                if HEAD_DIM != BLOCK_D:
                    dq_mask = dq_mask & (offs_d[None, :] < HEAD_DIM)
                tl.atomic_add(dq_dst + offs_m[:, None] * stride_dqm + offs_d[None, :], dq, mask=dq_mask,
                              sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=ROW_COUNTS)
def attention_bwd_dkdv_kernel(
    Q, K, V, dOut, Lse, Delta, dQ, dK, dV, CuSeqlensQ, CuSeqlensK, AlibiSlopes, Seed,
    stride_q, stride_k, stride_v, stride_do, stride_dq, stride_dk, stride_dv, stride_lse, stride_alibi_b,
    nheads, nheads_k, seqlen_q, seqlen_k, total_q, total_k, qk_scale, softmax_scale, window_left, window_right,
    softcap_in2, softcap_out, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr, USE_TMA: tl.constexpr,
    TMA_DQ: tl.constexpr, INTERPRET: tl.constexpr, LONG_ROWS: tl.constexpr = False,
    HEAD_DIM_V: tl.constexpr = 0, BLOCK_DV: tl.constexpr = 0,
):
    """dK and dV for one key tile of one kv head, summed over the query heads that share it (GQA).
    With USE_TMA, Q and dOut are row_tiles descriptors; with TMA_DQ, so is the fp32 dQ accumulator.
    HEAD_DIM_V / BLOCK_DV: V's, dOut's and dV's head dim where it differs from Q's and K's (0: the same)."""
    DV: tl.constexpr = HEAD_DIM_V if HEAD_DIM_V > 0 else HEAD_DIM
    BDV: tl.constexpr = BLOCK_DV if BLOCK_DV > 0 else BLOCK_D
    stride_qb, stride_qm, stride_qh = stride_q
    stride_kb, stride_kn, stride_kh = stride_k
    stride_vb, stride_vn, stride_vh = stride_v
    stride_dob, stride_dom, stride_doh = stride_do
    stride_dqb, stride_dqm, stride_dqh = stride_dq
    stride_dkb, stride_dkn, stride_dkh = stride_dk
    stride_dvb, stride_dvn, stride_dvh = stride_dv
    stride_lse_b, stride_lse_h = stride_lse
    if LONG_ROWS:
        # row index x row stride can pass 2**31 inside one sequence: 64-bit strides widen every row offset
        stride_qm, stride_kn, stride_vn, stride_dom = (stride_qm.to(tl.int64), stride_kn.to(tl.int64),
                                                       stride_vn.to(tl.int64), stride_dom.to(tl.int64))
        stride_dqm, stride_dkn, stride_dvn = (stride_dqm.to(tl.int64), stride_dkn.to(tl.int64),
                                              stride_dvn.to(tl.int64))
    start_n, off_b, off_hk, q_start, seqlen_q, k_start, seqlen_k = program_problem(
        nheads_k, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k, total_q, total_k, BLOCK_N, IS_VARLEN)
    if start_n >= seqlen_k:
        return
    group = nheads // nheads_k
    off_b64 = off_b.to(tl.int64)
    q_start64 = q_start.to(tl.int64)
    k_start64 = k_start.to(tl.int64)

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BDV)
    k_base = K + off_b64 * stride_kb + k_start64 * stride_kn + off_hk.to(tl.int64) * stride_kh
    v_base = V + off_b64 * stride_vb + k_start64 * stride_vn + off_hk.to(tl.int64) * stride_vh
    k = load_rows(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, seqlen_k, offs_d,
                  HEAD_DIM, BLOCK_D, True)
    v = load_rows(v_base + offs_n[:, None] * stride_vn + offs_dv[None, :], offs_n, seqlen_k, offs_dv,
                  DV, BDV, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BDV], dtype=tl.float32)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(Seed)

    m_lo, m_full_lo, m_full_hi, m_hi = q_range_for_kv_tile(start_n, seqlen_q, seqlen_k, window_left,
                                                           window_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    for g in range(0, group):
        off_h = off_hk * group + g
        off_h64 = off_h.to(tl.int64)
        if USE_TMA:
            q_src = Q
            do_src = dOut
        else:
            q_src = Q + off_b64 * stride_qb + q_start64 * stride_qm + off_h64 * stride_qh
            do_src = dOut + off_b64 * stride_dob + q_start64 * stride_dom + off_h64 * stride_doh
        if TMA_DQ:
            dq_dst = dQ
        else:
            dq_dst = dQ + off_b64 * stride_dqb + q_start64 * stride_dqm + off_h64 * stride_dqh
        row_off = off_b64 * stride_lse_b + off_h64 * stride_lse_h + q_start
        alibi_slope = alibi_slope_of(AlibiSlopes, off_b, off_h, stride_alibi_b, HAS_ALIBI)
        head_idx = off_b * nheads + off_h
        # rows the diagonal (window's right edge) or a sequence end crosses (masked), rows that see the whole
        # tile, then rows cut by the window's left edge (masked; the range is empty without one)
        bounds = (m_lo, m_full_lo, m_full_hi, m_hi)
        for r in tl.static_range(3):
            if r != 2 or HAS_LEFT:
                dk, dv = _dkdv_from_q_tiles(
                    dk, dv, k, v, q_src, do_src, dq_dst, Lse + row_off, Delta + row_off, tma_batch(off_b, IS_VARLEN),
                    off_h, q_start, stride_qm,
                    stride_dom, stride_dqm, offs_n, offs_d, bounds[r], bounds[r + 1], seqlen_q, seqlen_k, qk_scale,
                    softmax_scale, window_left, window_right, softcap_in2, softcap_out, alibi_slope, seed, head_idx,
                    dropout_p, HEAD_DIM, BLOCK_D, BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                    r != 1, ATOMIC_DQ, USE_TMA, TMA_DQ, INTERPRET, offs_dv, DV, BDV)

    # dK = scale * dS^T Q: the softmax scale is applied once, here
    dk_base = dK + off_b64 * stride_dkb + k_start64 * stride_dkn + off_hk.to(tl.int64) * stride_dkh
    dv_base = dV + off_b64 * stride_dvb + k_start64 * stride_dvn + off_hk.to(tl.int64) * stride_dvh
    store_rows(dk_base + offs_n[:, None] * stride_dkn + offs_d[None, :],
               round_to(dk * softmax_scale, dK.dtype.element_ty, INTERPRET),
               offs_n, seqlen_k, offs_d, HEAD_DIM, BLOCK_D)
    store_rows(dv_base + offs_n[:, None] * stride_dvn + offs_dv[None, :],
               round_to(dv, dV.dtype.element_ty, INTERPRET), offs_n, seqlen_k, offs_dv, DV, BDV)


@triton.jit
def _dq_from_kv_tiles(dq, q, do, lse, delta, k_src, v_src, off_b, off_hk, tma_row0, stride_kn, stride_vn, offs_m,
                      offs_d,
                      n_lo, n_hi, seqlen_q, seqlen_k, qk_scale, window_left, window_right,
                      softcap_in2, softcap_out, alibi_slope, seed, head_idx, dropout_p,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                      HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                      HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, MASKED: tl.constexpr,
                      USE_TMA: tl.constexpr, INTERPRET: tl.constexpr, offs_dv, DV: tl.constexpr,
                      BDV: tl.constexpr):
    """Accumulate dQ of one query tile over key tiles [n_lo, n_hi) (with USE_TMA from row tma_row0 + start_n of
    batch entry off_b, as in _dkdv_from_q_tiles)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(n_lo, n_hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = load_tile(k_src, off_b, off_hk, tma_row0 + start_n, offs_n, seqlen_k, stride_kn, offs_d, HEAD_DIM,
                      BLOCK_D, BLOCK_N, MASKED, USE_TMA)
        v = load_tile(v_src, off_b, off_hk, tma_row0 + start_n, offs_n, seqlen_k, stride_vn, offs_dv, DV,
                      BDV, BLOCK_N, MASKED, USE_TMA)
        s, scale_log2, tanh_s = masked_scores(
            q, k, offs_m[:, None], offs_n[None, :], seqlen_q, seqlen_k, qk_scale, window_left, window_right,
            softcap_in2, softcap_out, alibi_slope, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, MASKED, INTERPRET)
        p = tl.math.exp2(s * scale_log2 - lse[:, None])
        dp = mma(do, tl.trans(v), None, INTERPRET)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, offs_m[:, None], offs_n[None, :], head_idx, dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - tanh_s * tanh_s)
        dq = mma(round_to(ds, k.dtype, INTERPRET), k, dq, INTERPRET)
    return dq


@triton.jit(do_not_specialize=ROW_COUNTS)
def attention_bwd_dq_kernel(
    Q, K, V, dOut, Lse, Delta, dQ, CuSeqlensQ, CuSeqlensK, AlibiSlopes, Seed,
    stride_q, stride_k, stride_v, stride_do, stride_dq, stride_lse, stride_alibi_b,
    nheads, group, seqlen_q, seqlen_k, total_q, total_k, qk_scale, softmax_scale, window_left, window_right,
    softcap_in2, softcap_out, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, USE_TMA: tl.constexpr, INTERPRET: tl.constexpr,
    LONG_ROWS: tl.constexpr = False, HEAD_DIM_V: tl.constexpr = 0, BLOCK_DV: tl.constexpr = 0,
):
    """dQ for one query tile: no atomics, so it is bitwise reproducible. With USE_TMA, K and V are
    row_tiles descriptors. HEAD_DIM_V / BLOCK_DV as the dK/dV kernel's."""
    DV: tl.constexpr = HEAD_DIM_V if HEAD_DIM_V > 0 else HEAD_DIM
    BDV: tl.constexpr = BLOCK_DV if BLOCK_DV > 0 else BLOCK_D
    stride_qb, stride_qm, stride_qh = stride_q
    stride_kb, stride_kn, stride_kh = stride_k
    stride_vb, stride_vn, stride_vh = stride_v
    stride_dob, stride_dom, stride_doh = stride_do
    stride_dqb, stride_dqm, stride_dqh = stride_dq
    stride_lse_b, stride_lse_h = stride_lse
    if LONG_ROWS:
        stride_qm, stride_kn, stride_vn = stride_qm.to(tl.int64), stride_kn.to(tl.int64), stride_vn.to(tl.int64)
        stride_dom, stride_dqm = stride_dom.to(tl.int64), stride_dqm.to(tl.int64)
    start_m, off_b, off_h, q_start, seqlen_q, k_start, seqlen_k = program_problem(
        nheads, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k, total_q, total_k, BLOCK_M, IS_VARLEN)
    if start_m >= seqlen_q:
        return
    pid_bh = tl.program_id(1)  # the (batch, head) index that picks the dropout stream
    off_b64 = off_b.to(tl.int64)
    off_h64 = off_h.to(tl.int64)
    off_hk = off_h // group
    q_start64 = q_start.to(tl.int64)
    k_start64 = k_start.to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BDV)
    q = load_rows(Q + off_b64 * stride_qb + q_start64 * stride_qm + off_h64 * stride_qh
                  + offs_m[:, None] * stride_qm + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D, True)
    do = load_rows(dOut + off_b64 * stride_dob + q_start64 * stride_dom + off_h64 * stride_doh
                   + offs_m[:, None] * stride_dom + offs_dv[None, :], offs_m, seqlen_q, offs_dv, DV, BDV,
                   True)
    row_off = off_b64 * stride_lse_b + off_h64 * stride_lse_h + q_start
    lse = tl.load(Lse + row_off + offs_m, mask=offs_m < seqlen_q, other=float("inf")) * LOG2E
    delta = tl.load(Delta + row_off + offs_m, mask=offs_m < seqlen_q, other=0.0)
    alibi_slope = alibi_slope_of(AlibiSlopes, off_b, off_h, stride_alibi_b, HAS_ALIBI)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(Seed)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if USE_TMA:
        k_src = K
        v_src = V
    else:
        k_src = K + off_b64 * stride_kb + k_start64 * stride_kn + off_hk.to(tl.int64) * stride_kh
        v_src = V + off_b64 * stride_vb + k_start64 * stride_vn + off_hk.to(tl.int64) * stride_vh
    n_lo, n_full_lo, n_full_hi, n_hi = kv_range_for_q_tile(start_m, seqlen_q, seqlen_k, window_left,
                                                           window_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    # as the forward: key tiles cut by the window's left edge (masked; empty without one), whole, then crossed by
    # the diagonal or the end of the keys (masked)
    bounds = (n_lo, n_full_lo, n_full_hi, n_hi)
    for r in tl.static_range(3):
        if r != 0 or HAS_LEFT:
            dq = _dq_from_kv_tiles(
                dq, q, do, lse, delta, k_src, v_src, tma_batch(off_b, IS_VARLEN), off_hk, k_start,
                stride_kn, stride_vn, offs_m, offs_d, bounds[r],
                bounds[r + 1], seqlen_q, seqlen_k, qk_scale, window_left, window_right, softcap_in2, softcap_out,
                alibi_slope, seed, pid_bh, dropout_p, HEAD_DIM, BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                HAS_ALIBI, HAS_DROPOUT, r != 1, USE_TMA, INTERPRET, offs_dv, DV, BDV)
    store_rows(dQ + off_b64 * stride_dqb + q_start64 * stride_dqm + off_h64 * stride_dqh
               + offs_m[:, None] * stride_dqm + offs_d[None, :],
               round_to(dq * softmax_scale, dQ.dtype.element_ty, INTERPRET),
               offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D)


class BackwardPlan:
    """Everything about a backward call but its tensors, worked out once per shape and option set."""

    def __init__(self, dout, q, k, v, out, lse, opts: AttnOptions, config: BwdConfig | None,
                 gluon_launch=None) -> None:
        batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim = problem_dims(q, k, opts)
        self.empty = q.numel() == 0 or k.numel() == 0 or batch == 0
        if self.empty:
            return
        block_d = padded_head_dim(head_dim)
        # V's head dim where it differs from q's and k's (MLA): the kernels' HEAD_DIM_V, else left out
        head_dim_v = v.shape[-1]
        block_dv = padded_head_dim(head_dim_v)
        mla = dict(HEAD_DIM_V=head_dim_v, BLOCK_DV=block_dv) if head_dim_v != head_dim else {}
        cfg = config or bwd_config(max(block_d, block_dv), opts.causal, q.device)
        # gluon_launch() gives the Hopper kernel's launch (sm90/backward.py) where backends.py picks it, else None.
        # It computes dK and dV, and dQ too (fused_dq) except for deterministic calls, whose dQ comes from the dQ
        # kernel
        self.gluon = None if gluon_launch is None else gluon_launch()
        self.fused_dq = self.gluon is not None and self.gluon.fused_dq
        self.atomic_dq = atomic_dq = cfg.atomic_dq and not opts.deterministic and self.gluon is None
        varlen = opts.varlen
        total_q, total_k = q.shape[0], k.shape[0]
        self.device, self.lse_shape = q.device, lse.shape
        # a packed batch reads through (1, total, heads, head_dim) descriptors: rows past a sequence's end are
        # the next sequence's, which the kernels treat as they treat rows past seqlen (probabilities 0)
        use_tma = cfg.use_tma and tma_usable(q, k, v, dout) and not mla
        # the interpreter has no bulk reduce-add, so it keeps element atomics; the reduce-add's tiles need rows
        # that end at the sequence's end
        tma_dq = use_tma and atomic_dq and not INTERPRET and not varlen
        self.q_tiles = (cfg.block_m, block_d) if use_tma else None
        self.kv_tiles = (cfg.dq_block_n, block_d) if use_tma else None
        self.dq_tiles = (cfg.block_m, block_d) if tma_dq else None
        # a gradient takes its input's shape, contiguous
        dq_strides, dk_strides, dv_strides = (row_strides(torch.empty(x.shape, device="meta"), varlen)
                                              for x in (q, k, v))
        strides = dict(stride_q=row_strides(q, varlen), stride_k=row_strides(k, varlen),
                       stride_v=row_strides(v, varlen), stride_do=row_strides(dout, varlen), stride_dq=dq_strides,
                       stride_lse=lse_strides(lse, varlen))

        pre_block = 64 if not INTERPRET else 32
        self._preprocess_args = (
            bwd_preprocess_kernel, (cdiv(seqlen_q, pre_block), batch * nheads, 1), (),
            dict(stride_o=row_strides(out, varlen), stride_do=strides["stride_do"], stride_lse=strides["stride_lse"],
                 stride_dq=dq_strides, nheads=nheads, seqlen_q=seqlen_q, total_q=total_q, HEAD_DIM=head_dim,
                 BLOCK_D=block_d, BLOCK_M=pre_block, IS_VARLEN=varlen, ZERO_DQ=self.fused_dq, **mla), 4, 3)
        self.preprocess = Launch(*self._preprocess_args)
        # the preprocess summing dsink, by what Triton specialises the sink on (a Launch keeps its first kernel)
        self._sink_preprocess: dict[tuple, Launch] = {}
        named = dict(strides, nheads=nheads, seqlen_q=seqlen_q, seqlen_k=seqlen_k, total_q=total_q, total_k=total_k,
                     softmax_scale=opts.softmax_scale, HEAD_DIM=head_dim, BLOCK_D=block_d, INTERPRET=INTERPRET,
                     USE_TMA=use_tma, **opts.kernel_args(), **mla)
        named["LONG_ROWS"] = long_rows(0 if varlen else 1, q, k, v, dout)
        self.dkdv = Launch(
            attention_bwd_dkdv_kernel, (cdiv(seqlen_k, cfg.block_n), batch * nheads_k, 1), (),
            dict(named, stride_dk=dk_strides, stride_dv=dv_strides, nheads_k=nheads_k, BLOCK_M=cfg.block_m,
                 BLOCK_N=cfg.block_n, ATOMIC_DQ=atomic_dq, TMA_DQ=tma_dq),
            cfg.num_warps, cfg.num_stages)
        self.dq = None if atomic_dq or self.fused_dq else Launch(
            attention_bwd_dq_kernel, (cdiv(seqlen_q, cfg.dq_block_m), batch * nheads, 1), (),
            dict(named, group=nheads // nheads_k, BLOCK_M=cfg.dq_block_m, BLOCK_N=cfg.dq_block_n),
            cfg.dq_num_warps, cfg.dq_num_stages)

    def __call__(self, dout, q, k, v, out, lse, opts, sink=None):
        """(dq, dk, dv); sink: (learnable_sink, dsink), a float32 (nheads,) tensor that the preprocess adds the
        sink's gradient into (sinks.py; lse then includes the sink)."""
        if self.empty:
            # nothing to attend to (or nobody attending): every gradient is zero, and so is every out and Delta
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        device = self.device
        delta = common.empty(self.lse_shape, torch.float32, device)
        # the fused kernel adds softmax_scale * dQ into an fp32 buffer, tile by tile; the preprocess zeroes
        # the rows of every sequence (like dq on the other paths, a packed batch's rows past cu_seqlens_q[-1]
        # are left unwritten)
        dq_acc = torch.empty(q.shape, dtype=torch.float32, device=device) if self.fused_dq else None
        if sink is None:
            self.preprocess(out, dout, delta, delta if dq_acc is None else dq_acc, opts.cu_seqlens_q, None, None, None)
        else:
            key = (sink[0].dtype, align(sink[0]))
            launch = self._sink_preprocess.get(key)
            if launch is None:
                launch = self._sink_preprocess[key] = Launch(*self._preprocess_args)
            launch(out, dout, delta, delta if dq_acc is None else dq_acc, opts.cu_seqlens_q, lse, *sink)
        dk = common.empty(k.shape, k.dtype, device)
        dv = common.empty(v.shape, v.dtype, device)
        if self.gluon is not None:
            self.gluon(dout, q, k, v, lse, delta, dq_acc, dk, dv, opts)
            if self.fused_dq:
                return dq_acc.to(q.dtype), dk, dv
        # fp32 accumulation buffer for the atomic path; the dQ kernel writes dq directly
        dq = torch.zeros(q.shape, dtype=torch.float32, device=device) if self.atomic_dq else \
            common.empty(q.shape, q.dtype, device)
        pointers = opts.tensors()
        if self.gluon is None:
            q_src, do_src = (q, dout) if self.q_tiles is None else (row_tiles(q, *self.q_tiles),
                                                                    row_tiles(dout, *self.q_tiles))
            dq_dst = dq if self.dq_tiles is None else row_tiles(dq, *self.dq_tiles)
            self.dkdv(q_src, k, v, do_src, lse, delta, dq_dst, dk, dv, *pointers)
        if self.atomic_dq:
            return dq.to(q.dtype), dk, dv
        k_src, v_src = (k, v) if self.kv_tiles is None else (row_tiles(k, *self.kv_tiles),
                                                             row_tiles(v, *self.kv_tiles))
        self.dq(q, k_src, v_src, dout, lse, delta, dq, *pointers)
        return dq, dk, dv


# plans of these kernels alone (attention_backward); the calls of the package go through backends.backward_plan
_plans = PlanCache()


def plan_key(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, opts: AttnOptions, config: BwdConfig | None) -> tuple:
    """Everything a backward plan (of either backend) depends on besides the tensors' contents."""
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), dout.stride(), out.stride(), lse.shape,
            lse.stride(), q.dtype, k.dtype, v.dtype, dout.dtype, q.device, align(q), align(k), align(v), align(dout),
            align(out), opts.plan_key(), config)


def backward_plan(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, opts: AttnOptions, config: BwdConfig | None = None) -> BackwardPlan:
    """The plan of the Triton kernels for these inputs: made on the first call of a shape and option set, then
    looked up."""
    key = plan_key(dout, q, k, v, out, lse, opts, config)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.add(key, BackwardPlan(dout, q, k, v, out, lse, opts, config))
    return plan


def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       out: torch.Tensor, lse: torch.Tensor, opts: AttnOptions, config: BwdConfig | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the Triton backward kernels; returns (dq, dk, dv) shaped like q, k, v."""
    return backward_plan(dout, q, k, v, out, lse, opts, config)(dout, q, k, v, out, lse, opts)
