"""Two-stage variants (twentieth session) of mla_bwd_64row.py: DO_STAGES (dO ring apart from Q's), DQ_STAGE
(0: separate dq32 staging, 1: dq32 in the dq64 buffer, 2: dq32 in the P buffer, 3: dQ as three sequential
[64, 32] blocks in three 8 KB slots), DS_BUFS=1 with a ds_free barrier.

Compile-only register-pressure model of a FlashAttention-3-style MLA (192/128) backward step in Gluon:
64 query rows a step, non-swapped scores (S = Q Kᵀ, M = the 64 query rows), swapped dK/dV (dKᵀ = Qᵀ dS,
dVᵀ = dOᵀ P, M = the head dim), dQ = dS K split by columns between the two consumer warpgroups.

Not integrated into the package and never run on a GPU: it exists to show what ptxas makes of the live
accumulators (registers, spills, wgmma serialisation C7512) on sm_90a with triton 3.6.

Gluon (triton 3.6) takes only power-of-two shapes, in registers and in shared memory alike (checked: a
[64, 48] accumulator and a 48-column smem view are both refused). FA3's 48 keys a warpgroup are therefore
modelled as two key pieces, NA + NB (32 + 16): each score-like tile (S, dP, dKᵀ's and dVᵀ's column blocks) is a
pair of accumulators of N = NA and N = NB, the same registers as one N = 48 accumulator (24 + 24 a thread for
S and dP, 72 for dKᵀ, 48 for dVᵀ), at twice the wgmma instructions. NB = 0 gives one piece (32 or 64 keys a
warpgroup: 64- or 128-key programs).

Each warpgroup's dQ columns: 96 of 192 as a 64-column chunk plus half of chunk 1 (warpgroup 0: chunk 0 and
columns 64..95; warpgroup 1: chunk 2 and columns 96..127), i.e. a [64, 64] and a [64, 32] accumulator (48
registers), reduce-added through two fp32 staging buffers and two TMA descriptors (64 and 32 columns).

Tuning (constexpr): NA, NB (keys per warpgroup piece), STAGES (Q/dO ring), P_SMEM (P not kept in fp32
registers across dP's wait: dS from P read back from shared memory), DQ_SEQ (dQ's two column blocks one after
the other, each waited for and reduce-added before the next is issued), DS_BUFS (dS buffers; 2: the reuse rule
of backward._dq_tile, no extra barrier), HAS_SOFTCAP (a softcap's tanh kept for dS).
"""

import contextlib
import re

import torch
import triton

from flashattn2.kernels.common import LOG2E
from flashattn2.kernels.device.block_range import q_range_for_kv_tile
from flashattn2.kernels.device.scores import score_tail
from flashattn2.kernels.device.tma import tma_batch
from flashattn2.kernels.sm90.common import (
    WorkGrid,
    compile_gluon,
    free_phase,
    ready_phase,
    strip_maxnreg,
    wgmma_layout,
)
from flashattn2.kernels.sm90.gluon_api import (
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    shared_layout,
    thread_barrier,
    tma_load,
    tma_reduce_add,
    tma_store_wait,
    warpgroup_mma,
    warpgroup_mma_wait,
)

QK_DIM = gl.constexpr(192)
V_DIM = gl.constexpr(128)
CH = gl.constexpr(64)  # Q and K in 64-column chunks (three)
NCH = gl.constexpr(3)
BLOCK_M = gl.constexpr(64)
MAXNREG = 168
CONSUMER_REGS = gl.constexpr(240)


@gluon.jit
def _producer(q_desc, ka_desc, kb_desc, va_desc, vb_desc, do_desc, q_s, ka_s, kb_s, va_s, vb_s, do_s, lse_s, delta_s,
              kv_bar, kv_empty, q_ready, do_ready, empty, Lse, Delta, stride_lse_b, stride_lse_h, grid: WorkGrid,
              NA: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr, do_empty, DO_STAGES: gl.constexpr):
    """K and V of the item once (per warpgroup and key piece, 64-column chunks of K), then Q (three chunks), dO
    and the rows' lse, Delta per 64-row step through the STAGES ring."""
    KW: gl.constexpr = NA + NB
    BLOCK_N: gl.constexpr = 2 * KW
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    KV_A: gl.constexpr = 2 * NCH * ka_desc.block_type.nbytes + 2 * va_desc.block_type.nbytes
    KV_B: gl.constexpr = 2 * NCH * kb_desc.block_type.nbytes + 2 * vb_desc.block_type.nbytes
    kv_bytes: gl.constexpr = KV_A + KV_B if NB > 0 else KV_A
    it = 0
    done = 0
    first, last, step = grid.steps()
    for tile in range(first, last, step):
        start_n, off_b, off_hk, q_row0, n_rows, k_row0, n_keys = grid.item(tile, BLOCK_N, False, False)
        m_lo, _, _, m_hi = q_range_for_kv_tile(start_n, n_rows, n_keys, grid.window_left, grid.window_right,
                                               BLOCK_M, BLOCK_N, False, True)
        tma_b = tma_batch(off_b, False)
        mbarrier.wait(kv_empty, free_phase(done, 1))
        mbarrier.expect(kv_bar, kv_bytes)
        for w in gl.static_range(2):
            key = k_row0 + start_n + w * KW
            for c in gl.static_range(NCH):
                tma_load(ka_desc, [tma_b, key, off_hk, c * CH], kv_bar, ka_s.index(w * NCH + c))
                if NB > 0:
                    tma_load(kb_desc, [tma_b, key + NA, off_hk, c * CH], kv_bar, kb_s.index(w * NCH + c))
            tma_load(va_desc, [tma_b, key, off_hk, 0], kv_bar, va_s.index(w))
            if NB > 0:
                tma_load(vb_desc, [tma_b, key + NA, off_hk, 0], kv_bar, vb_s.index(w))
        for g in range(0, grid.group):
            off_h = off_hk * grid.group + g
            row_off = off_b.to(gl.int64) * stride_lse_b + off_h.to(gl.int64) * stride_lse_h + q_row0
            for start_m in range(m_lo, m_hi, BLOCK_M):
                stage = it % STAGES
                mbarrier.wait(empty.index(stage), free_phase(it, STAGES))
                mbarrier.expect(q_ready.index(stage), NCH * q_desc.block_type.nbytes)
                for c in gl.static_range(NCH):
                    tma_load(q_desc, [tma_b, q_row0 + start_m, off_h, c * CH], q_ready.index(stage),
                             q_s.index(stage * NCH + c))
                dstage = it % DO_STAGES
                mbarrier.wait(do_empty.index(dstage), free_phase(it, DO_STAGES))
                mbarrier.expect(do_ready.index(dstage), do_desc.block_type.nbytes)
                tma_load(do_desc, [tma_b, q_row0 + start_m, off_h, 0], do_ready.index(dstage), do_s.index(dstage))
                offs = start_m + gl.arange(0, BLOCK_M, layout=flat)
                lse = gl.load(Lse + row_off + offs, mask=offs < n_rows, other=float("inf"))
                delta = gl.load(Delta + row_off + offs, mask=offs < n_rows, other=0.0)
                lse_s.index(dstage).store(lse * LOG2E)
                delta_s.index(dstage).store(delta)
                mbarrier.arrive(do_ready.index(dstage), count=1)
                it += 1
        done += 1


@gluon.jit
def _probs(s, offs_m, offs_n, lse, n_rows, n_keys, qk_scale, window_left, window_right, softcap_in2, softcap_out,
           HAS_SOFTCAP: gl.constexpr, MASKED: gl.constexpr):
    """P = exp2(S * scale - lse) of one key piece ([queries, keys]), the causal mask on MASKED steps."""
    s, scale_log2, tanh_s = score_tail(s, offs_m[:, None], offs_n[None, :], n_rows, n_keys, qk_scale, window_left,
                                       window_right, softcap_in2, softcap_out, 0.0, False, True, HAS_SOFTCAP, False,
                                       MASKED)
    return gl.exp2(s * scale_log2 - lse[:, None]), tanh_s


@gluon.jit
def _ds(p, dp, delta, tanh_s, HAS_SOFTCAP: gl.constexpr):
    ds = p * (dp - delta[:, None])
    if HAS_SOFTCAP:
        ds = ds * (1.0 - tanh_s * tanh_s)
    return ds


@gluon.jit
def _dq32_block(dsa_s, ka_s, slot, dq32_desc, buf, dyn, tma_b, dq_row, off_h, softmax_scale, NA: gl.constexpr,
                CC: gl.constexpr, COL: gl.constexpr):
    """dQ[:, CC * 64 + COL : +32] = dS K over both warpgroups' keys, waited for and reduce-added from `slot`."""
    dqj = gl.zeros([BLOCK_M, 32], gl.float32, wgmma_layout(32))
    for h in gl.static_range(2):
        k_cols = ka_s.index(h * NCH + CC + dyn).reshape([NA, CH]).slice(COL, 32, dim=1)
        dqj = warpgroup_mma(dsa_s.index(buf * 2 + h), k_cols,
                            dqj, use_acc=h > 0, is_async=True)
    dqj = warpgroup_mma_wait(0, deps=[dqj])
    slot.store(dqj * softmax_scale)
    fence_async_shared()
    tma_reduce_add(dq32_desc, [tma_b, dq_row, off_h, CC * CH + COL], slot.reshape([1, BLOCK_M, 1, 32]))


@gluon.jit
def _step(it, start_m, dk, dv, q_s, ka_s, kb_s, va_s, vb_s, do_s, pa_s, pb_s, dsa_s, dsb_s, dq64_s, dq32_s, lse_s,
          delta_s, q_ready, do_ready, empty, ds_ready, dq64_desc, dq32_desc, tma_b, dq_row0, off_h, offs_na, offs_nb,
          n_rows, n_keys, qk_scale, softmax_scale, window_left, window_right, softcap_in2, softcap_out,
          WG: gl.constexpr, NA: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr, DS_BUFS: gl.constexpr,
          P_SMEM: gl.constexpr, DQ_SEQ: gl.constexpr, HAS_SOFTCAP: gl.constexpr, MASKED: gl.constexpr,
          SDP_SEQ: gl.constexpr, do_empty, ds_free, DO_STAGES: gl.constexpr, DQ_STAGE: gl.constexpr):
    """One 64-row (Q, dO) step of this warpgroup's NA + NB keys. dk: dKᵀ as (3 chunks of [64, NA]) + (3 of
    [64, NB]); dv: dVᵀ as (2 of [64, NA]) + (2 of [64, NB])."""
    la: gl.constexpr = wgmma_layout(NA)
    dyn = it >> 30  # a zero ptxas cannot see through (backward._step_cols): no hoisted wgmma descriptors
    stage = it % STAGES + dyn
    phase = ready_phase(it, STAGES)
    buf = it % DS_BUFS + dyn
    dstage = it % DO_STAGES + dyn
    dphase = ready_phase(it, DO_STAGES)
    do_t = do_s.index(dstage).reshape([BLOCK_M, V_DIM])
    l32: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, 32], gl.float32)
    if DQ_STAGE == 0 or DQ_STAGE == 3:
        dq32_v = dq32_s.index(WG)
    elif DQ_STAGE == 1:  # dq32 staged in the first half of this warpgroup's dq64 buffer
        dq32_v = dq64_s.index(WG)._reinterpret(gl.float32, [BLOCK_M, 32], l32)
    else:  # dq32 staged in this warpgroup's P buffer (8 KB bf16 = [64, 32] fp32)
        dq32_v = pa_s.index(WG)._reinterpret(gl.float32, [BLOCK_M, 32], l32)
    # S = Q Kᵀ for this warpgroup's keys, [64 queries, NA] (+ [64, NB]), async over Q's three chunks
    mbarrier.wait(q_ready.index(stage), phase)
    s_a = gl.zeros([BLOCK_M, NA], gl.float32, la)
    for c in gl.static_range(NCH):
        s_a = warpgroup_mma(q_s.index(stage * NCH + c).reshape([BLOCK_M, CH]),
                            ka_s.index(WG * NCH + c + dyn).reshape([NA, CH]).permute([1, 0]), s_a, use_acc=c > 0,
                            is_async=True)
    if NB > 0:
        lb: gl.constexpr = wgmma_layout(NB)
        s_b = gl.zeros([BLOCK_M, NB], gl.float32, lb)
        for c in gl.static_range(NCH):
            s_b = warpgroup_mma(q_s.index(stage * NCH + c).reshape([BLOCK_M, CH]),
                                kb_s.index(WG * NCH + c + dyn).reshape([NB, CH]).permute([1, 0]), s_b,
                                use_acc=c > 0, is_async=True)
    # dP = dO Vᵀ (SDP_SEQ: issued only once P is in shared memory, so that S and dP are never live together)
    mbarrier.wait(do_ready.index(dstage), dphase)
    if not SDP_SEQ:
        dp_a = warpgroup_mma(do_t, va_s.index(WG + dyn).reshape([NA, V_DIM]).permute([1, 0]),
                             gl.zeros([BLOCK_M, NA], gl.float32, la), use_acc=False, is_async=True)
        if NB > 0:
            dp_b = warpgroup_mma(do_t, vb_s.index(WG + dyn).reshape([NB, V_DIM]).permute([1, 0]),
                                 gl.zeros([BLOCK_M, NB], gl.float32, lb), use_acc=False, is_async=True)
            s_a, s_b = warpgroup_mma_wait(2, deps=[s_a, s_b])
        else:
            s_a = warpgroup_mma_wait(1, deps=[s_a])
    else:
        if NB > 0:
            s_a, s_b = warpgroup_mma_wait(0, deps=[s_a, s_b])
        else:
            s_a = warpgroup_mma_wait(0, deps=[s_a])
    # P: a row's lse is 2 registers a thread in this orientation
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, la))
    lse = lse_s.index(dstage).load(gl.SliceLayout(1, la))
    if DQ_STAGE == 2:
        tma_store_wait(0)  # the previous step's dq32 reduce-add has read the P buffer
    p_a, tanh_a = _probs(s_a, offs_m, offs_na, lse, n_rows, n_keys, qk_scale, window_left, window_right,
                         softcap_in2, softcap_out, HAS_SOFTCAP, MASKED)
    pa_s.index(WG).store(p_a.to(pa_s.dtype))
    if NB > 0:
        offs_mb = gl.convert_layout(offs_m, gl.SliceLayout(1, lb))
        lse_b = gl.convert_layout(lse, gl.SliceLayout(1, lb))
        p_b, tanh_b = _probs(s_b, offs_mb, offs_nb, lse_b, n_rows, n_keys, qk_scale, window_left, window_right,
                             softcap_in2, softcap_out, HAS_SOFTCAP, MASKED)
        pb_s.index(WG).store(p_b.to(pb_s.dtype))
    fence_async_shared()
    thread_barrier()  # this warpgroup's P, all of it, before its dVᵀ wgmmas read it
    if SDP_SEQ:
        dp_a = warpgroup_mma(do_t, va_s.index(WG + dyn).reshape([NA, V_DIM]).permute([1, 0]),
                             gl.zeros([BLOCK_M, NA], gl.float32, la), use_acc=False, is_async=True)
        if NB > 0:
            dp_b = warpgroup_mma(do_t, vb_s.index(WG + dyn).reshape([NB, V_DIM]).permute([1, 0]),
                                 gl.zeros([BLOCK_M, NB], gl.float32, lb), use_acc=False, is_async=True)
    # dVᵀ += dOᵀ P: M = dV's 128 columns (two 64-row blocks), N = this warpgroup's keys
    DVN: gl.constexpr = V_DIM // 64
    dv_new = ()
    for m in gl.static_range(DVN):
        dv_new = dv_new + (warpgroup_mma(do_t.slice(m * 64, 64, dim=1).permute([1, 0]), pa_s.index(WG), dv[m],
                                         is_async=True),)
    if NB > 0:
        for m in gl.static_range(DVN):
            dv_new = dv_new + (warpgroup_mma(do_t.slice(m * 64, 64, dim=1).permute([1, 0]), pb_s.index(WG),
                                             dv[DVN + m], is_async=True),)
    if P_SMEM:  # P leaves the registers: dS from the bf16 P in shared memory
        p_a = pa_s.index(WG).load(la).to(gl.float32)
        if NB > 0:
            p_b = pb_s.index(WG).load(lb).to(gl.float32)
    delta = delta_s.index(dstage).load(gl.SliceLayout(1, la))
    if NB > 0:
        dp_a, dp_b = warpgroup_mma_wait(len(dv_new), deps=[dp_a, dp_b])
    else:
        dp_a = warpgroup_mma_wait(len(dv_new), deps=[dp_a])
    ds_a = _ds(p_a, dp_a, delta, tanh_a, HAS_SOFTCAP)
    if DS_BUFS == 1:  # both warpgroups' dQ of the previous step are done with the single dS buffer
        mbarrier.wait(ds_free, free_phase(it, 1))
    dsa_s.index(buf * 2 + WG).store(ds_a.to(dsa_s.dtype))
    if NB > 0:
        ds_b = _ds(p_b, dp_b, gl.convert_layout(delta, gl.SliceLayout(1, lb)), tanh_b, HAS_SOFTCAP)
        dsb_s.index(buf * 2 + WG).store(ds_b.to(dsb_s.dtype))
    fence_async_shared()
    # one arrival per warpgroup (Triton syncs the warpgroup before its elected thread arrives): both halves of dS
    # for dQ, and this warpgroup's own for its dKᵀ
    mbarrier.arrive(ds_ready.index(buf), count=1)
    # dKᵀ += Qᵀ dS: M = Q's 64-column chunk, N = this warpgroup's keys
    dk_new = ()
    for c in gl.static_range(NCH):
        dk_new = dk_new + (warpgroup_mma(q_s.index(stage * NCH + c).reshape([BLOCK_M, CH]).permute([1, 0]),
                                         dsa_s.index(buf * 2 + WG), dk[c], is_async=True),)
    if NB > 0:
        for c in gl.static_range(NCH):
            dk_new = dk_new + (warpgroup_mma(q_s.index(stage * NCH + c).reshape([BLOCK_M, CH]).permute([1, 0]),
                                             dsb_s.index(buf * 2 + WG), dk[NCH + c], is_async=True),)
    # dQ = dS K over the program's keys (both warpgroups' dS): this warpgroup's 96 columns as chunk C0 (64) and
    # half of chunk 1 (32)
    mbarrier.wait(ds_ready.index(buf), ready_phase(it, DS_BUFS))
    C0: gl.constexpr = 2 * WG
    dq_row = dq_row0 + start_m
    if DQ_STAGE == 3:  # dQ as three [64, 32] blocks one after the other, staged in three 8 KB slots
        slots = dq64_s.index(WG)._reinterpret(gl.float32, [2, BLOCK_M, 32], l32)
        res = warpgroup_mma_wait(0, deps=dk_new + dv_new)
        dk_new = res[0:len(dk_new)]
        dv_new = res[len(dk_new):]
        tma_store_wait(2)
        _dq32_block(dsa_s, ka_s, slots.index(0), dq32_desc, buf, dyn, tma_b, dq_row, off_h, softmax_scale, NA, C0, 0)
        tma_store_wait(2)
        _dq32_block(dsa_s, ka_s, slots.index(1), dq32_desc, buf, dyn, tma_b, dq_row, off_h, softmax_scale, NA, C0, 32)
        tma_store_wait(2)
        _dq32_block(dsa_s, ka_s, dq32_v, dq32_desc, buf, dyn, tma_b, dq_row, off_h, softmax_scale, NA, 1, WG * 32)
        mbarrier.arrive(empty.index(stage), count=1)
        mbarrier.arrive(do_empty.index(dstage), count=1)
        if DS_BUFS == 1:
            mbarrier.arrive(ds_free, count=1)
        return dk_new, dv_new
    dq64 = gl.zeros([BLOCK_M, 64], gl.float32, wgmma_layout(64))
    for h in gl.static_range(2):
        dq64 = warpgroup_mma(dsa_s.index(buf * 2 + h), ka_s.index(h * NCH + C0 + dyn).reshape([NA, CH]), dq64,
                             use_acc=h > 0, is_async=True)
        if NB > 0:
            dq64 = warpgroup_mma(dsb_s.index(buf * 2 + h), kb_s.index(h * NCH + C0 + dyn).reshape([NB, CH]), dq64,
                                 is_async=True)
    if DQ_SEQ:  # the 64-column block out before the 32-column one is issued
        dq64 = warpgroup_mma_wait(0, deps=[dq64])
        tma_store_wait(0)
        dq64_s.index(WG).store(dq64 * softmax_scale)
        fence_async_shared()
        tma_reduce_add(dq64_desc, [tma_b, dq_row, off_h, C0 * CH], dq64_s.index(WG).reshape([1, BLOCK_M, 1, 64]))
    dq32 = gl.zeros([BLOCK_M, 32], gl.float32, wgmma_layout(32))
    for h in gl.static_range(2):
        dq32 = warpgroup_mma(dsa_s.index(buf * 2 + h),
                             ka_s.index(h * NCH + 1 + dyn).reshape([NA, CH]).slice(WG * 32, 32, dim=1), dq32,
                             use_acc=h > 0, is_async=True)
        if NB > 0:
            dq32 = warpgroup_mma(dsb_s.index(buf * 2 + h),
                                 kb_s.index(h * NCH + 1 + dyn).reshape([NB, CH]).slice(WG * 32, 32, dim=1), dq32,
                                 is_async=True)
    if DQ_SEQ:
        res = warpgroup_mma_wait(0, deps=dk_new + dv_new + (dq32,))
        dk_new = res[0:len(dk_new)]
        dv_new = res[len(dk_new):len(dk_new) + len(dv_new)]
        dq32 = res[len(dk_new) + len(dv_new)]
        mbarrier.arrive(empty.index(stage), count=1)
        mbarrier.arrive(do_empty.index(dstage), count=1)
        if DS_BUFS == 1:
            mbarrier.arrive(ds_free, count=1)
        if DQ_STAGE == 1:
            tma_store_wait(0)
        else:
            tma_store_wait(1)
        dq32_v.store(dq32 * softmax_scale)
    else:
        res = warpgroup_mma_wait(0, deps=dk_new + dv_new + (dq64, dq32))
        dk_new = res[0:len(dk_new)]
        dv_new = res[len(dk_new):len(dk_new) + len(dv_new)]
        dq64 = res[len(dk_new) + len(dv_new)]
        dq32 = res[len(dk_new) + len(dv_new) + 1]
        mbarrier.arrive(empty.index(stage), count=1)
        mbarrier.arrive(do_empty.index(dstage), count=1)
        if DS_BUFS == 1:
            mbarrier.arrive(ds_free, count=1)
        tma_store_wait(0)
        dq64_s.index(WG).store(dq64 * softmax_scale)
        dq32_v.store(dq32 * softmax_scale)
    fence_async_shared()
    if not DQ_SEQ:
        tma_reduce_add(dq64_desc, [tma_b, dq_row, off_h, C0 * CH], dq64_s.index(WG).reshape([1, BLOCK_M, 1, 64]))
    tma_reduce_add(dq32_desc, [tma_b, dq_row, off_h, CH + WG * 32], dq32_v.reshape([1, BLOCK_M, 1, 32]))
    return dk_new, dv_new


@gluon.jit
def _store_t(ptr_base, acc, key0, col0, n_keys, stride_n, ROWS: gl.constexpr, N: gl.constexpr):
    """An accumulator of [ROWS head-dim columns, N keys] (dKᵀ / dVᵀ) into its [keys, head dim] place."""
    lay: gl.constexpr = wgmma_layout(N)
    d = col0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, lay))
    keys = key0 + gl.arange(0, N, layout=gl.SliceLayout(0, lay))
    gl.store(ptr_base + keys.to(gl.int64)[None, :] * stride_n + d[:, None], acc, mask=keys[None, :] < n_keys)


@gluon.jit
def _consumer(WG: gl.constexpr, q_s, ka_s, kb_s, va_s, vb_s, do_s, pa_s, pb_s, dsa_s, dsb_s, dq64_s, dq32_s, lse_s,
              delta_s, kv_bar, kv_empty, q_ready, do_ready, empty, ds_ready, dq64_desc, dq32_desc, dK, dV,
              stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh, grid: WorkGrid, qk_scale,
              softmax_scale, softcap_in2, softcap_out, NA: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr,
              DS_BUFS: gl.constexpr, P_SMEM: gl.constexpr, DQ_SEQ: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
              SDP_SEQ: gl.constexpr, do_empty, ds_free, DO_STAGES: gl.constexpr, DQ_STAGE: gl.constexpr):
    KW: gl.constexpr = NA + NB
    BLOCK_N: gl.constexpr = 2 * KW
    la: gl.constexpr = wgmma_layout(NA)
    lb: gl.constexpr = wgmma_layout(NB if NB > 0 else NA)
    it = 0
    done = 0
    first, last, step = grid.steps()
    for tile in range(first, last, step):
        start_n, off_b, off_hk, q_row0, n_rows, k_row0, n_keys = grid.item(tile, BLOCK_N, False, False)
        m_lo, m_full_lo, m_full_hi, m_hi = q_range_for_kv_tile(start_n, n_rows, n_keys, grid.window_left,
                                                               grid.window_right, BLOCK_M, BLOCK_N, False, True)
        tma_b = tma_batch(off_b, False)
        key0 = start_n + WG * KW
        offs_na = key0 + gl.arange(0, NA, layout=gl.SliceLayout(0, la))
        offs_nb = key0 + NA + gl.arange(0, NB if NB > 0 else NA, layout=gl.SliceLayout(0, lb))
        za = gl.zeros([64, NA], gl.float32, la)
        if NB > 0:
            zb = gl.zeros([64, NB], gl.float32, lb)
            dk = (za, za, za, zb, zb, zb)
            dv = (za, za, zb, zb)
        else:
            dk = (za, za, za)
            dv = (za, za)
        mbarrier.wait(kv_bar, ready_phase(done, 1))
        for g in range(0, grid.group):
            off_h = off_hk * grid.group + g
            bounds = (m_lo, m_full_lo, m_full_hi, m_hi)
            for r in gl.static_range(3):
                for start_m in range(bounds[r], bounds[r + 1], BLOCK_M):
                    dk, dv = _step(it, start_m, dk, dv, q_s, ka_s, kb_s, va_s, vb_s, do_s, pa_s, pb_s, dsa_s, dsb_s,
                                   dq64_s, dq32_s, lse_s, delta_s, q_ready, do_ready, empty, ds_ready, dq64_desc,
                                   dq32_desc, tma_b, q_row0, off_h, offs_na, offs_nb, n_rows, n_keys, qk_scale,
                                   softmax_scale, grid.window_left, grid.window_right, softcap_in2, softcap_out, WG,
                                   NA, NB, STAGES, DS_BUFS, P_SMEM, DQ_SEQ, HAS_SOFTCAP, r != 1, SDP_SEQ, do_empty,
                                   ds_free,
                                   DO_STAGES, DQ_STAGE)
                    it += 1
        mbarrier.arrive(kv_empty, count=1)
        # dK = scale dSᵀ Q and dV, stored transposed from dKᵀ / dVᵀ (the epilogue is not what this models)
        dk_base = (dK + off_b.to(gl.int64) * stride_dkb + off_hk.to(gl.int64) * stride_dkh
                   + k_row0.to(gl.int64) * stride_dkn)
        dv_base = (dV + off_b.to(gl.int64) * stride_dvb + off_hk.to(gl.int64) * stride_dvh
                   + k_row0.to(gl.int64) * stride_dvn)
        for c in gl.static_range(NCH):
            _store_t(dk_base, (dk[c] * softmax_scale).to(dK.dtype.element_ty), key0, c * CH, n_keys, stride_dkn,
                     64, NA)
            if NB > 0:
                _store_t(dk_base, (dk[NCH + c] * softmax_scale).to(dK.dtype.element_ty), key0 + NA, c * CH, n_keys,
                         stride_dkn, 64, NB)
        for m in gl.static_range(2):
            _store_t(dv_base, dv[m].to(dV.dtype.element_ty), key0, m * 64, n_keys, stride_dvn, 64, NA)
            if NB > 0:
                _store_t(dv_base, dv[2 + m].to(dV.dtype.element_ty), key0 + NA, m * 64, n_keys, stride_dvn, 64, NB)
        done += 1
    tma_store_wait(0)


@gluon.jit
def mla_bwd_rows_kernel(q_desc, ka_desc, kb_desc, va_desc, vb_desc, do_desc, dq64_desc, dq32_desc, Lse, Delta, dK, dV,
                        stride_dk, stride_dv, stride_lse, nheads, nheads_k, seqlen_q, seqlen_k, qk_scale,
                        softmax_scale, softcap_in2, softcap_out, num_tiles,
                        NA: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr, DS_BUFS: gl.constexpr,
                        P_SMEM: gl.constexpr, DQ_SEQ: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
                        FREE_REGS: gl.constexpr, SDP_SEQ: gl.constexpr = False,
                        DO_STAGES: gl.constexpr = 1, DQ_STAGE: gl.constexpr = 0):
    stride_dkb, stride_dkn, stride_dkh = stride_dk
    stride_dvb, stride_dvn, stride_dvh = stride_dv
    stride_lse_b, stride_lse_h = stride_lse
    KW: gl.constexpr = NA + NB
    BLOCK_N: gl.constexpr = 2 * KW
    dtype: gl.constexpr = q_desc.dtype
    grid = WorkGrid(gl.cdiv(seqlen_k, BLOCK_N), num_tiles, 1, nheads_k, nheads // nheads_k, None, None, seqlen_q,
                    seqlen_k, 0, 0, -1, 0, None)
    # K: per warpgroup and piece, three 64-column chunks; V: per warpgroup and piece
    ka_s = gl.allocate_shared_memory(dtype, [2 * NCH, 1, NA, 1, CH], ka_desc.layout)
    va_s = gl.allocate_shared_memory(dtype, [2, 1, NA, 1, V_DIM], va_desc.layout)
    if NB > 0:
        kb_s = gl.allocate_shared_memory(dtype, [2 * NCH, 1, NB, 1, CH], kb_desc.layout)
        vb_s = gl.allocate_shared_memory(dtype, [2, 1, NB, 1, V_DIM], vb_desc.layout)
    else:
        kb_s = ka_s
        vb_s = va_s
    q_s = gl.allocate_shared_memory(dtype, [STAGES * NCH, 1, BLOCK_M, 1, CH], q_desc.layout)
    do_s = gl.allocate_shared_memory(dtype, [DO_STAGES, 1, BLOCK_M, 1, V_DIM], do_desc.layout)
    # P (one buffer a warpgroup: only its own dVᵀ reads it) and dS (DS_BUFS x 2 warpgroups), [queries, keys]
    pa_s = gl.allocate_shared_memory(dtype, [2, BLOCK_M, NA],
                                     gl.NVMMASharedLayout.get_default_for([BLOCK_M, NA], dtype))
    dsa_s = gl.allocate_shared_memory(dtype, [2 * DS_BUFS, BLOCK_M, NA],
                                      gl.NVMMASharedLayout.get_default_for([BLOCK_M, NA], dtype))
    if NB > 0:
        pb_s = gl.allocate_shared_memory(dtype, [2, BLOCK_M, NB],
                                         gl.NVMMASharedLayout.get_default_for([BLOCK_M, NB], dtype))
        dsb_s = gl.allocate_shared_memory(dtype, [2 * DS_BUFS, BLOCK_M, NB],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_M, NB], dtype))
    else:
        pb_s = pa_s
        dsb_s = dsa_s
    # dQ staging for the reduce-adds: a [64, 64] and a [64, 32] fp32 block per warpgroup
    dq64_s = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, 64],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, 64], gl.float32))
    if DQ_STAGE == 0 or DQ_STAGE == 3:
        dq32_s = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, 32],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_M, 32], gl.float32))
    else:
        dq32_s = dq64_s
    rows_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    lse_s = gl.allocate_shared_memory(gl.float32, [DO_STAGES, BLOCK_M], rows_layout)
    delta_s = gl.allocate_shared_memory(gl.float32, [DO_STAGES, BLOCK_M], rows_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [DO_STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [DO_STAGES, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(ds_free, count=2)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [DS_BUFS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(kv_empty, count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    for i in gl.static_range(DO_STAGES):
        mbarrier.init(do_ready.index(i), count=2)
        mbarrier.init(do_empty.index(i), count=2)
    for i in gl.static_range(DS_BUFS):
        mbarrier.init(ds_ready.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize([
        (_producer, (q_desc, ka_desc, kb_desc, va_desc, vb_desc, do_desc, q_s, ka_s, kb_s, va_s, vb_s, do_s, lse_s,
                     delta_s, kv_bar, kv_empty, q_ready, do_ready, empty, Lse, Delta, stride_lse_b, stride_lse_h,
                     grid, NA, NB, STAGES, do_empty, DO_STAGES)),
        (_consumer, (0, q_s, ka_s, kb_s, va_s, vb_s, do_s, pa_s, pb_s, dsa_s, dsb_s, dq64_s, dq32_s, lse_s, delta_s,
                     kv_bar, kv_empty, q_ready, do_ready, empty, ds_ready, dq64_desc, dq32_desc, dK, dV, stride_dkb,
                     stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh, grid, qk_scale, softmax_scale,
                     softcap_in2, softcap_out, NA, NB, STAGES, DS_BUFS, P_SMEM, DQ_SEQ, HAS_SOFTCAP, SDP_SEQ,
                     do_empty, ds_free, DO_STAGES, DQ_STAGE)),
        (_consumer, (1, q_s, ka_s, kb_s, va_s, vb_s, do_s, pa_s, pb_s, dsa_s, dsb_s, dq64_s, dq32_s, lse_s, delta_s,
                     kv_bar, kv_empty, q_ready, do_ready, empty, ds_ready, dq64_desc, dq32_desc, dK, dV, stride_dkb,
                     stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh, grid, qk_scale, softmax_scale,
                     softcap_in2, softcap_out, NA, NB, STAGES, DS_BUFS, P_SMEM, DQ_SEQ, HAS_SOFTCAP, SDP_SEQ,
                     do_empty, ds_free, DO_STAGES, DQ_STAGE)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
    mbarrier.invalidate(kv_bar)
    mbarrier.invalidate(kv_empty)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(q_ready.index(i))
        mbarrier.invalidate(empty.index(i))
    for i in gl.static_range(DO_STAGES):
        mbarrier.invalidate(do_ready.index(i))
        mbarrier.invalidate(do_empty.index(i))
    mbarrier.invalidate(ds_free)
    for i in gl.static_range(DS_BUFS):
        mbarrier.invalidate(ds_ready.index(i))


@contextlib.contextmanager
def one_cta_registers(one_cta=True):
    """common.free_registers (PTX without `.maxnreg`, so that each partition gets its setmaxnreg), plus, with
    one_cta, `.minnctapersm 1` (CUDA's __launch_bounds__(384, 1)). Without it ptxas 12.8 may print C7508 ("'setmaxnreg'
    ignored; unable to determine register count at entry") and then allocates the whole kernel within 168
    registers: every trivial variant of this kernel did; the package's MLA kernel does not. Triton 3.6 does not put
    its stage hook into the cache key: compile with TRITON_ALWAYS_COMPILE=1."""
    runtime = triton.knobs.runtime
    previous = runtime.add_stages_inspection_hook

    def edit(ptx):
        ptx = strip_maxnreg(ptx)
        if one_cta and ".minnctapersm" not in ptx:
            ptx = re.sub(r"^(\.reqntid[^\n]*\n)", r"\1.minnctapersm 1\n", ptx, count=1, flags=re.MULTILINE)
        return ptx

    def hook(*args):
        if not args:  # triton >= 3.7 asks for a cache key first
            return "mla64-one-cta", "mla64-one-cta"
        if previous is not None:
            previous(*args)
        stages = args[1]
        make_ptx = stages["ptx"]
        stages["ptx"] = lambda src, metadata: edit(make_ptx(src, metadata))

    runtime.add_stages_inspection_hook = hook
    try:
        yield
    finally:
        runtime.add_stages_inspection_hook = previous


DEFAULTS = dict(DO_STAGES=None, DQ_STAGE=0, SDP_SEQ=False, NA=32, NB=16, STAGES=1, DS_BUFS=2, P_SMEM=False,
                DQ_SEQ=False, HAS_SOFTCAP=False, FREE_REGS=True, ONE_CTA=True)


def kernel_constants(**flags):
    """(the kernel's constexpr arguments, ONE_CTA): DEFAULTS with `flags`, DO_STAGES None taking STAGES. One
    function for compile_for_sm90 and launch_args, so that a launch runs the kernel that was compiled."""
    constants = dict(DEFAULTS, **flags)
    if constants["DO_STAGES"] is None:
        constants["DO_STAGES"] = constants["STAGES"]
    one_cta = constants.pop("ONE_CTA")
    return constants, one_cta


def descriptor_blocks(constants):
    """Each descriptor argument's block: (the inputs' ones, in the inputs' dtype; the fp32 dQ ones)."""
    na, nb = constants["NA"], constants["NB"]
    nbx = nb if nb > 0 else na
    inputs = dict(q_desc=[1, 64, 1, 64], ka_desc=[1, na, 1, 64], kb_desc=[1, nbx, 1, 64], va_desc=[1, na, 1, 128],
                  vb_desc=[1, nbx, 1, 128], do_desc=[1, 64, 1, 128])
    return inputs, dict(dq64_desc=[1, 64, 1, 64], dq32_desc=[1, 64, 1, 32])


def compile_for_sm90(dtype=torch.bfloat16, **flags):
    """Compile the prototype for sm_90a (no GPU needed), as backward.compile_for_sm90 does the package's kernel."""
    constants, one_cta = kernel_constants(**flags)
    descriptors, dq_blocks = descriptor_blocks(constants)
    types = dict(Lse="*fp32", Delta="*fp32", dK="*DTYPE", dV="*DTYPE", qk_scale="fp32", softmax_scale="fp32",
                 softcap_in2="fp32", softcap_out="fp32")
    for name, block in dq_blocks.items():
        types[name] = f"tensordesc<fp32[{','.join(map(str, block))}],{shared_layout(block, torch.float32)!r}>"
    ctx = one_cta_registers(one_cta) if constants["FREE_REGS"] else contextlib.nullcontext()
    with ctx:
        return compile_gluon(mla_bwd_rows_kernel, dtype, 192, descriptors, types, constants, MAXNREG, False)


def launch_args(q, k, v, do, dq_acc, lse, delta, dk, dv, softmax_scale, **flags):
    """(every argument of mla_bwd_rows_kernel in its order, constexprs included as Triton's launcher takes them;
    num_tiles) for dense causal q (batch, seqlen_q, heads, 192), k (batch, seqlen_k, heads_k, 192), v and dO
    (..., 128), dq_acc: a zeroed fp32 tensor like q that receives softmax_scale * dQ (= dQ), lse (natural log, as
    the package's forward returns it) and delta: (batch, heads, seqlen_q) with the same strides, dk, dv like k, v.
    The work items are (128-key tile, batch x kv head) pairs: num_tiles of them; any grid size walks them all."""
    from flashattn2.kernels.params import LOG2E as LOG2E_HOST
    from flashattn2.kernels.params import lse_strides, row_strides
    from flashattn2.kernels.sm90.common import descriptor

    constants, _ = kernel_constants(**flags)
    blocks, dq_blocks = descriptor_blocks(constants)
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    assert lse.shape == delta.shape == (batch, nheads, seqlen_q) and lse.stride() == delta.stride()
    assert dk.shape == k.shape and dv.shape == v.shape and dq_acc.shape == q.shape and dq_acc.dtype == torch.float32
    sources = dict(q_desc=q, ka_desc=k, kb_desc=k, va_desc=v, vb_desc=v, do_desc=do)
    values = {name: descriptor(sources[name], block, shared_layout(block, sources[name].dtype))
              for name, block in blocks.items()}
    values.update({name: descriptor(dq_acc, block, shared_layout(block, torch.float32))
                   for name, block in dq_blocks.items()})
    block_n = 2 * (constants["NA"] + constants["NB"])
    num_tiles = -(-seqlen_k // block_n) * batch * nheads_k
    values.update(Lse=lse, Delta=delta, dK=dk, dV=dv, stride_dk=row_strides(dk, False),
                  stride_dv=row_strides(dv, False), stride_lse=lse_strides(lse, False), nheads=nheads,
                  nheads_k=nheads_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k, qk_scale=float(softmax_scale * LOG2E_HOST),
                  softmax_scale=float(softmax_scale), softcap_in2=0.0, softcap_out=0.0, num_tiles=num_tiles,
                  **constants)
    return [values[name] for name in mla_bwd_rows_kernel.arg_names], num_tiles
