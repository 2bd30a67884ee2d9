"""Hopper (sm_90) backward in Gluon, in FlashAttention-3's structure.

Work items are (key tile, batch x kv head) pairs; a program takes one, or (a persistent grid, dense calls
without a right window edge) loops over several. Three warp partitions:
- a producer (the default partition) loads the item's K and V once, then streams (Q, dO) tiles of BLOCK_M
  query rows, for every query head of the GQA group, through a ring of STAGES shared-memory stages
  (q_ready / do_ready expect-tx barriers, a count-2 empty barrier; kv_empty frees K/V for the next item);
- two consumer warpgroups on transposed scores (keys x queries), so that Pᵀ and dSᵀ come out of the S and dP
  matmuls in the accumulator layout. At head dims 64 and 128 the item is 128 keys, one 64-key half per
  warpgroup, and Pᵀ, dSᵀ feed the dV += Pᵀ dO and dK += dSᵀ Q matmuls from registers. At 256 (SPLIT_D: dK
  and dV of 64 x 256 do not fit a warpgroup's registers) the item is 64 keys; each warpgroup computes Pᵀ and
  dSᵀ for half the query rows, shares them through shared memory, and accumulates half of the head dim's
  columns of dV, dK (and dQ). dK and dV stay in registers for the whole item.

FUSED_DQ (FlashAttention-3's five matmuls per tile pair): the consumers also compute dQ = dS K for the tile,
each warpgroup half of its columns (DQ_ROWS, 128-row tiles: half of its rows), and add it into an fp32 dQ
buffer with one bulk (TMA) reduce-add per tile. Without it dQ comes from the portable dQ kernel
(portable/backward.py): the deterministic path, since reduce-adds land in any order.
"""

import numpy as np
import torch

from ..common import LOG2E, cdiv, l2_section
from ..device.block_range import q_range_for_kv_tile
from ..device.scores import alibi_slope_of, score_tail
from ..device.seqlen_info import ROW_COUNTS
from ..device.tile_order import MAX_SCHEDULED_ITEMS, decoded_schedule, schedule_items, sectioned_items
from ..device.tma import tma_batch
from ..launch import Launch
from ..params import AttnOptions, lse_strides, problem_dims, row_strides
from .common import (
    _SCALAR,
    WG_M,
    BlockLists,
    ScoreMod,
    WorkGrid,
    _value,
    compile_gluon,
    descriptor,
    free_phase,
    free_registers,
    mod_signature,
    p_layout,
    ready_phase,
    sm90_declines,
    wgmma_layout,
)
from .gluon_api import (
    aggregate,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    shared_layout,
    tma_load,
    tma_reduce_add,
    tma_store_wait,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# head dim -> tuning, measured on the H100 (benchmarks/NOTES.md). FUSED_DQ needs query tiles of 64 rows or
# more (wgmma's M for dQ = dS K); the dK/dV-only kernel (deterministic calls) keeps 32-row tiles.
# DQ_ROWS: each warpgroup takes half of a 128-row tile's dQ rows, not half of its columns (d64: +1-6% non-causal,
# +1-2% causal to 4k, 2026-11-24). COALESCED_DKV: dK and dV leave through a shared-memory layout change in
# 16-byte pieces (+6-7% at 1k, +2-4% at 4k, -1% to +2% at 16k; d256 has no shared memory left for it).
# L2_SECTIONS (one program per item: causal, packed): items walk key tile by key tile over sections of heads whose
# Q, dO and dQ fit in 1/L2_SECTIONS of L2, longest first (device/tile_order.py); 0: one head after another.
# Causal, 1k-8k: d128 +0.5 to +5%, d64 (half of L2) 0 to +6%; d256 lost 5% at 1k and keeps 0 (2026-11-24).
# PERSISTENT_CAUSAL: causal (right-edged) dense calls on the persistent grid with the host's schedule, kernel time
# causal 1k-8k: d64 +2 to +7%, d128 +1 to +5% (H200, 2026-11-27)
CONFIGS = {64: dict(BLOCK_M=128, STAGES=2, FUSED_DQ=True, SPLIT_D=False, PERSISTENT=True, DQ_ROWS=True,
                    COALESCED_DKV=True, L2_SECTIONS=2, PERSISTENT_CAUSAL=True),
           128: dict(BLOCK_M=64, STAGES=2, FUSED_DQ=True, SPLIT_D=False, PERSISTENT=True, DQ_ROWS=False,
                     COALESCED_DKV=True, L2_SECTIONS=1, PERSISTENT_CAUSAL=True),
           256: dict(BLOCK_M=64, STAGES=1, FUSED_DQ=True, SPLIT_D=True, PERSISTENT=True, DQ_ROWS=False,
                     COALESCED_DKV=False, L2_SECTIONS=0)}
_DKDV = dict(FUSED_DQ=False, PERSISTENT=True, DQ_ROWS=False, COALESCED_DKV=False, L2_SECTIONS=0)
CONFIGS_DKDV = {64: dict(BLOCK_M=32, STAGES=3, SPLIT_D=False, **_DKDV),
                128: dict(BLOCK_M=32, STAGES=3, SPLIT_D=False, **_DKDV),
                256: dict(BLOCK_M=64, STAGES=2, SPLIT_D=True, **_DKDV)}
MAXNREG = 168
CONSUMER_REGS = gl.constexpr(240)
# FREE_REGS (a tuning key; CONFIGS_MLA sets it, the others not): compile under
# common.free_registers, so the consumers get the 240 registers their setmaxnreg grants instead of the launch's 168.
# sm_90 (triton 3.6) spill stores, capped -> free: d64 20 -> 0, d128 causal packed 44 -> 8, block-sparse d128 28
# -> 16, with a softcap score_mod 272 -> 148. The kernel ignores the argument; it keys Triton's cache. Measured at
# d64/d128 (1k-16k, H100): -4% to +3% at most lengths, -10% at 16k in the dK/dV kernel, so off there.
MLA_QK_DIM, MLA_CHUNK = gl.constexpr(192), gl.constexpr(64)
# DQ_WRITER's staged tile address (batch, row, head, unused): all four in each thread, so no shuffles to read one
DQ_AT_LAYOUT = gl.constexpr(gl.BlockedLayout([4], [32], [4], [0]))
# a value head dim unlike the query's (MLA's 192/128): 128-key items (_step_mla_wide). Each warpgroup holds dK's
# three 64-column chunks and dV for its 64 keys (160 registers of accumulators), so the query tiles are 32 rows (dQ
# as dQᵀ = Kᵀ dSᵀ) and the consumers take their setmaxnreg's 240 registers (FREE_REGS). sm_90 (triton 3.6): 185 KB
# of shared memory, 116 bytes of spill stores, all outside the query-tile loop (64-row tiles spilled 1.4 KB).
# Against the 64-key items (CONFIGS_MLA_NARROW), whose step ncu showed L2-bound (93% of L2 throughput): half the
# dQ reduce-adds and Q/dO reads per FLOP; backward 1.03-1.08x cuDNN's time causal at 2k-16k where they ran
# 1.25-1.32x (bf16, H100, 2026-11-25, benchmarks/NOTES.md)
CONFIGS_MLA = {(192, 128): dict(BLOCK_M=32, STAGES=3, FUSED_DQ=True, SPLIT_D=False, PERSISTENT=True, DQ_ROWS=False,
                                COALESCED_DKV=True, L2_SECTIONS=0, FREE_REGS=True, DQ_SPARE_SLOT=True,
                                DQ_WRITER=True, DQ_PAIR=True)}
# COALESCED_DKV (dK chunk 0 and dV through shared memory into 16-byte row pieces): whole backward 0.966-0.993 of
# the plain stores' time at 2k-16k causal, two runs (H200, 2026-11-28); sm_90 spill stores 116 -> 128 bytes
# (not located). L2_SECTIONS 1 and 2 (longest items first over L2-sized sections, which a list-scheduling model put at
# +5-7% at 2k-8k) measured 0.98-1.04, so off
# DQ_WRITER: the producer warpgroup issues the dQ reduce-adds (_dq_write) from two sets of staging buffers, so the
# consumers stage, fence and arrive but never wait on a reduce-add; a warp of its own does not fit (the consumers'
# 240 registers leave the producer warpgroup 24). DQ_PAIR: warpgroup 0 keeps both its dQ chunks' matmuls in flight
# before it stages either. Whole backward time over the consumers' reduce-adds, causal 2k / 4k / 8k / 16k, two runs
# of 8 alternating rounds (H200, 2026-11-29, benchmarks/results/2026-11-29_s34_ab): both 0.982 / 0.977 / 0.991 /
# 0.994 and 0.982 / 0.985 / 0.967 / 0.992; DQ_WRITER alone 0.992-1.009, DQ_PAIR alone 0.988-0.997. 226 KB of shared
# memory (the writer's second set: 24 KB), 16 fewer spill bytes. DQ_SPARE_SLOT then applies only without the writer
# DQ_SPARE_SLOT: a second dQ staging buffer for warpgroup 0, so that its chunk 1 need not wait for chunk 0's
# reduce-add to read the first (ncu at 2k: that wait held warpgroup 0 in 8% of its samples); 8 KB more shared memory
# (185 KB), no more traffic. Measured -1.6% to +0.2% backward time at 2k-16k over two runs (H200, 2026-11-27)
# the 64-key items (_step_mla), kept to compare: as SPLIT_D's, Q and K as three 64-column buffers each, two Q/dO
# stages (shared memory: K 24 KB, V 16, Q 48, dO 32, P and dS 32, dQ 48)
CONFIGS_MLA_NARROW = {(192, 128): dict(CONFIGS_MLA[(192, 128)], BLOCK_M=64, STAGES=2, SPLIT_D=True, FREE_REGS=False,
                                       DQ_SPARE_SLOT=False)}
# PERSISTENT_CAUSAL (a host tuning key; CONFIGS' d64 and d128): dense calls with a right window edge (causal) on a
# persistent grid too, each program taking the items a host-made schedule gives it (the forward's "scheduled" walk),
# so that the producer loads an item's K and V under the last one's dK/dV stores. MLA's 128-key items: -2.0% to
# +1.4% at 2k-16k (H200, 2026-11-27), so off in CONFIGS_MLA (with one L2 section below 8k rows: the table below)
# dense causal (right-edged) MLA calls of at most this many query rows, over CONFIGS_MLA's entry: the scheduled
# persistent grid, items over one L2-sized section, longest first. Time over the default in three runs with
# COALESCED_DKV (H200, 2026-11-28, benchmarks/results/2026-11-28_s22_ab/04-06): 2k 0.978 / 0.983 / 0.991, 4k 0.993 /
# 0.997 / 0.996, 8k 0.988 / 0.982 / 0.975; at 16k 1.011 / 1.025 / 1.036, so longer calls keep one program per item
# PLACED_SCHEDULE (a host key, off where left out): the schedule table holds each item's place worked out
# (tile_order.decoded_schedule, one int64 an item) instead of its index, as the forward's does. d64 / d128 causal
# whole backward 0.990 / 0.986 and 0.999 / 0.984 at 512 / 2k (H200, 2026-11-28, results/2026-11-28_s25_ab/01), so off
# there; MLA 192/128 on this grid 0.988 / 0.991 / 0.989 of the index table's time at 2k / 4k / 8k (six alternating
# rounds, H200, 2026-11-28, results/2026-11-28_s26_ab/01; sm_90 6,336 -> 5,832 instructions)
CONFIGS_MLA_SHORT_CAUSAL = {(192, 128): (8192, dict(PERSISTENT_CAUSAL=True, L2_SECTIONS=1, PLACED_SCHEDULE=True))}
HOST_TUNING_KEYS = ("PERSISTENT", "PERSISTENT_CAUSAL", "L2_SECTIONS", "PLACED_SCHEDULE")


def causal_walk_costs(num_blocks: int, num_bh: int, section: int, seqlen_q: int, seqlen_k: int, opts: AttnOptions,
                      block_m: int, block_n: int, group: int, item_cost: int = 1) -> np.ndarray:
    """Each item's cost in the sectioned walk of a dense right-edged (causal) backward, in query-tile steps: its
    query tiles (q_range_for_kv_tile's range) for each of the kv head's `group` query heads, plus item_cost for
    the item's own prologue and epilogue."""
    start = sectioned_items(num_blocks, num_bh, section)[0] * block_n  # the first key tiles see the most rows
    diag = seqlen_k - seqlen_q
    last_key = np.minimum(start + block_n, seqlen_k) - 1
    m_lo = np.clip(start - diag - opts.window_right, 0, seqlen_q) // block_m * block_m
    m_hi = np.full_like(m_lo, seqlen_q)
    if opts.window_left >= 0:
        m_hi = np.clip(last_key - diag + opts.window_left + 1, 0, seqlen_q)
    return group * np.maximum(-(-(m_hi - m_lo) // block_m), 0) + item_cost


@aggregate
class BwdSmem:
    """A program's shared memory, as one argument of its partitions: the work item's K and V halves, the ring
    of (Q, dO, lse, Delta) stages, P and dS (SPLIT_D) or the dSᵀ halves of both warpgroups (fused dQ), the dQ
    blocks staged for their reduce-adds; and the barriers (kv_bar / kv_empty: K and V loaded / free; q_ready,
    do_ready, empty: a stage's Q, its dO with lse and Delta, its release; p_ready, ds_ready: both halves of P, dS
    stored); with DQ_WRITER two sets of staged dQ blocks, each with its address (dq_at: batch, row, head) and its
    barriers (dq_full: staged by both warpgroups; dq_empty: read by the reduce-adds). A kernel without a buffer
    passes another in its place, unused."""
    k: gl.shared_memory_descriptor
    v: gl.shared_memory_descriptor
    q: gl.shared_memory_descriptor
    do: gl.shared_memory_descriptor
    p: gl.shared_memory_descriptor
    ds: gl.shared_memory_descriptor
    dq: gl.shared_memory_descriptor
    lse: gl.shared_memory_descriptor
    delta: gl.shared_memory_descriptor
    kv_bar: gl.shared_memory_descriptor
    kv_empty: gl.shared_memory_descriptor
    q_ready: gl.shared_memory_descriptor
    do_ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    p_ready: gl.shared_memory_descriptor
    ds_ready: gl.shared_memory_descriptor
    dq_at: gl.shared_memory_descriptor
    dq_full: gl.shared_memory_descriptor
    dq_empty: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, k, v, q, do, p, ds, dq, lse, delta, kv_bar, kv_empty, q_ready, do_ready, empty, p_ready,
                 ds_ready, dq_at, dq_full, dq_empty):
        self.k = k
        self.v = v
        self.q = q
        self.do = do
        self.p = p
        self.ds = ds
        self.dq = dq
        self.lse = lse
        self.delta = delta
        self.kv_bar = kv_bar
        self.kv_empty = kv_empty
        self.q_ready = q_ready
        self.do_ready = do_ready
        self.empty = empty
        self.p_ready = p_ready
        self.ds_ready = ds_ready
        self.dq_at = dq_at
        self.dq_full = dq_full
        self.dq_empty = dq_empty


@aggregate
class Scores:
    """The launch's scalars of the score tail and of the gradients: log2-scaled softmax scale, softmax scale,
    softcap's inner and outer factors."""
    qk_scale: _SCALAR
    softmax_scale: _SCALAR
    softcap_in2: _SCALAR
    softcap_out: _SCALAR

    @gluon.constexpr_function
    def __init__(self, qk_scale, softmax_scale, softcap_in2, softcap_out):
        self.qk_scale = _value(qk_scale)
        self.softmax_scale = _value(softmax_scale)
        self.softcap_in2 = _value(softcap_in2)
        self.softcap_out = _value(softcap_out)


@gluon.jit
def _work_item(tile, grid: WorkGrid, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr,
               HAS_RIGHT: gl.constexpr, IS_VARLEN: gl.constexpr):
    """Where work item `tile` lies: (batch, kv head, first key, the sequence's bounds, query ranges).
    Items run key tile by key tile over sections of grid.section (batch, kv head) pairs whose Q, dO and dQ fit
    in L2 (device/tile_order.py): programs running together share them, and a causal grid, whose first key
    tiles see the most queries, starts its longest items first."""
    start_n, off_b, off_hk, q_start, seqlen_q, k_start, seqlen_k = grid.item(tile, BLOCK_N, False, IS_VARLEN)
    m_lo, m_full_lo, m_full_hi, m_hi = q_range_for_kv_tile(start_n, seqlen_q, seqlen_k, grid.window_left,
                                                           grid.window_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    return off_b, off_hk, start_n, q_start, seqlen_q, k_start, seqlen_k, m_lo, m_full_lo, m_full_hi, m_hi


@gluon.jit
def _head_ranges(lists: BlockLists, off_b, off_h, start_n, m_lo, m_full_lo, m_full_hi, m_hi, BLOCK_M: gl.constexpr):
    """The query "ranges" of one query head of a work item: the dense ones, or with a block mask (lists.on) the
    head's visit tiles (BLOCK_M apart: its partial query blocks' tiles, masked, then the full ones) and `visit`,
    where its lists are."""
    if lists.on:
        m_lo, m_full_lo, m_full_hi, m_hi, visit = lists.ranges(off_b, off_h, start_n, BLOCK_M)
    else:
        visit = (0, 0, 0)
    return m_lo, m_full_lo, m_full_hi, m_hi, visit


@gluon.jit
def _producer(q_desc, k_desc, v_desc, do_desc, dq_desc, sm: BwdSmem, Lse, Delta, stride_lse_b, stride_lse_h,
              grid: WorkGrid, lists: BlockLists, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, IS_VARLEN: gl.constexpr, WRITER: gl.constexpr):
    """Loads each work item's K and V, then its steps' Q, dO, lse and Delta through the STAGES-deep ring; with
    WRITER also the dQ writer: step it - STAGES's staged dQ, reduce-added once the step's loads are issued (so the
    loads never wait on it), and the rest of an item's before the next item's K and V wait for the consumers."""
    KV_TILES: gl.constexpr = BLOCK_N // WG_M
    # MLA: Q and K as QK_CHUNKS 64-column tiles, a buffer each (_step_mla)
    QK_CHUNKS: gl.constexpr = sm.q.shape[0] // STAGES
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    it = 0  # Q/dO ring slot, counted across work items
    done = 0  # work items loaded, for the K/V barriers' phases
    written = 0  # WRITER: steps whose dQ has been reduce-added
    first, last, step = grid.steps()
    for tile in range(first, last, step):
        off_b, off_hk, start_n, q_row0, n_rows, k_row0, n_keys, item_m_lo, _, _, item_m_hi = _work_item(
            tile, grid, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, IS_VARLEN)
        if start_n < n_keys:  # else a packed sequence shorter than the longest one
            tma_b = tma_batch(off_b, IS_VARLEN)
            if WRITER:  # the item's last steps first: the consumers free K and V only after staging them
                for h in range(written, it):
                    _dq_write(h, sm, dq_desc)
                written = it
            # the consumers free K and V after their last matmul of the previous work item
            mbarrier.wait(sm.kv_empty, free_phase(done, 1))
            mbarrier.expect(sm.kv_bar, KV_TILES * (QK_CHUNKS * k_desc.block_type.nbytes + v_desc.block_type.nbytes))
            for t in gl.static_range(KV_TILES):
                for c in gl.static_range(QK_CHUNKS):
                    tma_load(k_desc, [tma_b, k_row0 + start_n + t * WG_M, off_hk, c * MLA_CHUNK], sm.kv_bar,
                             sm.k.index(t * QK_CHUNKS + c))
                tma_load(v_desc, [tma_b, k_row0 + start_n + t * WG_M, off_hk, 0], sm.kv_bar, sm.v.index(t))
            for g in range(0, grid.group):
                off_h = off_hk * grid.group + g
                row_off = off_b.to(gl.int64) * stride_lse_b + off_h.to(gl.int64) * stride_lse_h + q_row0
                m_lo, _, _, m_hi, visit = _head_ranges(lists, off_b, off_h, start_n, item_m_lo, item_m_lo, item_m_hi,
                                                       item_m_hi, BLOCK_M)
                for start_m in range(m_lo, m_hi, BLOCK_M):
                    row_m = start_m
                    if lists.on:  # start_m counts visit tiles
                        row_m = lists.tile_start(visit, start_m // BLOCK_M, BLOCK_M)
                    stage = it % STAGES
                    mbarrier.wait(sm.empty.index(stage), free_phase(it, STAGES))
                    mbarrier.expect(sm.q_ready.index(stage), QK_CHUNKS * q_desc.block_type.nbytes)
                    for c in gl.static_range(QK_CHUNKS):
                        tma_load(q_desc, [tma_b, q_row0 + row_m, off_h, c * MLA_CHUNK], sm.q_ready.index(stage),
                                 sm.q.index(stage * QK_CHUNKS + c))
                    mbarrier.expect(sm.do_ready.index(stage), do_desc.block_type.nbytes)
                    tma_load(do_desc, [tma_b, q_row0 + row_m, off_h, 0], sm.do_ready.index(stage),
                             sm.do.index(stage))
                    # the tile's rows of lse (log2 units) and Delta, staged here so that the consumers never wait
                    # on global loads; rows past seqlen_q read lse = +inf, which makes their probabilities exactly 0
                    offs = row_m + gl.arange(0, BLOCK_M, layout=flat)
                    lse = gl.load(Lse + row_off + offs, mask=offs < n_rows, other=float("inf"))
                    if lists.on:  # FlexAttention's lse of a row that sees no key is -inf: its P must be 0 too
                        lse = gl.where(lse == float("-inf"), float("inf"), lse)
                    delta = gl.load(Delta + row_off + offs, mask=offs < n_rows, other=0.0)
                    sm.lse.index(stage).store(lse * LOG2E)
                    sm.delta.index(stage).store(delta)
                    mbarrier.arrive(sm.do_ready.index(stage), count=1)
                    if WRITER:
                        if it - written >= STAGES:  # step it - STAGES released this stage before its dQ
                            _dq_write(written, sm, dq_desc)
                            written += 1
                    it += 1
            done += 1
    if WRITER:
        for h in range(written, it):
            _dq_write(h, sm, dq_desc)


@gluon.jit
def _dq_write(h, sm: BwdSmem, dq_desc):
    """DQ_WRITER's reduce-adds of step h: its dQ chunks, staged by both warpgroups in set h % 2 with their address,
    added into the fp32 dQ buffer; the set is free again once the reduce-adds have read it."""
    s = h % 2
    CH: gl.constexpr = MLA_QK_DIM // MLA_CHUNK
    BLOCK_M: gl.constexpr = sm.dq.shape[1]
    mbarrier.wait(sm.dq_full.index(s), ready_phase(h, 2))
    at = sm.dq_at.index(s).load(DQ_AT_LAYOUT)
    idx = gl.arange(0, 4, layout=DQ_AT_LAYOUT)
    tma_b = gl.sum(gl.where(idx == 0, at, 0), axis=0)
    row = gl.sum(gl.where(idx == 1, at, 0), axis=0)
    head = gl.sum(gl.where(idx == 2, at, 0), axis=0)
    for c in gl.static_range(CH):
        tma_reduce_add(dq_desc, [tma_b, row, head, c * MLA_CHUNK],
                       sm.dq.index(s * CH + c).reshape([1, BLOCK_M, 1, MLA_CHUNK]))
    tma_store_wait(0)
    mbarrier.arrive(sm.dq_empty.index(s), count=1)


@gluon.jit
def _dq_add(dq, sm: BwdSmem, dq_desc, tma_b, dq_row, dq_head, sc: Scores, WG: gl.constexpr, ROW0: gl.constexpr,
            COL0: gl.constexpr):
    """Add softmax_scale * dq, this warpgroup's block of a query tile's dQ (rows ROW0.. and columns COL0.. of
    the tile at dq_row), into the fp32 dQ buffer: staged in shared memory for one bulk (TMA) reduce-add."""
    # the reduce-add of the last tile must have read the buffer before it is written again
    tma_store_wait(0)
    sm.dq.index(WG).store(dq * sc.softmax_scale)
    fence_async_shared()
    tma_reduce_add(dq_desc, [tma_b, dq_row + ROW0, dq_head, COL0],
                   sm.dq.index(WG).reshape([1, dq.shape[0], 1, dq.shape[1]]))


@gluon.jit
def _dq_tile(it, dst16, sm: BwdSmem, dq_desc, tma_b, dq_row, dq_head, sc: Scores,
             WG: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr, DQ_ROWS: gl.constexpr):
    """This warpgroup's block of dQ for one query tile, dS K over both key halves: half of the columns, or
    (DQ_ROWS, 128-row tiles) half of the rows with every column, which reads a third less shared memory (N =
    the head dim, not half of it; FlashAttention-3's d64 layout). dSᵀ of this half goes to buffer it % 2 for
    both warpgroups: a warpgroup reaches buffer it % 2 again only after waiting for the other's step it + 1,
    which comes after that one's dQ matmul of step it retired."""
    dyn = it >> 30  # as in _step_cols: no hoisted (spilled) wgmma descriptors
    buf = it % 2 + dyn
    sm.ds.index(2 * buf + WG).store(dst16)
    fence_async_shared()
    mbarrier.arrive(sm.ds_ready.index(buf), count=1)
    mbarrier.wait(sm.ds_ready.index(buf), ready_phase(it, 2))
    DQ_M: gl.constexpr = BLOCK_M // 2 if DQ_ROWS else BLOCK_M
    DQ_N: gl.constexpr = BLOCK_D if DQ_ROWS else BLOCK_D // 2
    dq = gl.zeros([DQ_M, DQ_N], gl.float32, wgmma_layout(DQ_N))
    for h in gl.static_range(2):
        ds_half = sm.ds.index(2 * buf + h)  # [keys, queries]
        k_half = sm.k.index(h + dyn).reshape([WG_M, BLOCK_D])
        if DQ_ROWS:
            ds_half = ds_half.slice(WG * DQ_M, DQ_M, dim=1)
        else:
            k_half = k_half.slice(WG * DQ_N, DQ_N, dim=1)
        dq = warpgroup_mma(ds_half.permute([1, 0]), k_half, dq, use_acc=h > 0, is_async=True)
    dq = warpgroup_mma_wait(0, deps=[dq])
    if DQ_ROWS:
        _dq_add(dq, sm, dq_desc, tma_b, dq_row, dq_head, sc, WG, WG * DQ_M, 0)
    else:
        _dq_add(dq, sm, dq_desc, tma_b, dq_row, dq_head, sc, WG, 0, WG * DQ_N)


@gluon.jit
def _ds_t(pt, dpt, delta, tanht, raw, offs_m, offs_n, mod: ScoreMod, HAS_SOFTCAP: gl.constexpr):
    """dSᵀ = Pᵀ (dPᵀ - Delta), times the softcap's and a score_mod's derivatives."""
    dst = pt * (dpt - delta[None, :])
    if HAS_SOFTCAP:
        dst = dst * (1.0 - tanht * tanht)
    if mod.on:
        dst = dst * mod.derivative(raw, offs_m[None, :], offs_n[:, None])
    return dst


@gluon.jit
def _probs_t(st_tok, start_m, stage, sm: BwdSmem, sc: Scores, lists: BlockLists, visit, mod: ScoreMod, offs_n,
             seqlen_q, seqlen_k, window_left, window_right, alibi_slope, BLOCK_M: gl.constexpr, HAS_LEFT: gl.constexpr,
             HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, MASKED: gl.constexpr):
    """Pᵀ of a warpgroup's 64 keys against a query tile, from its Sᵀ (st_tok, still in flight): the tile's start
    (a block mask's visit tile), query offsets, the raw scores (a score_mod's derivative is taken there), Pᵀ, the
    rows' Delta and the softcap's tanh (_step, _step_mla_wide)."""
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    tile = start_m // BLOCK_M  # a visit tile with a block mask
    if lists.on:
        start_m = lists.tile_start(visit, tile, BLOCK_M)
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    st = warpgroup_mma_wait(1, deps=[st_tok])
    raw = st
    st = mod.scores(st, offs_m[None, :], offs_n[:, None])
    if lists.on and MASKED:  # a block mask's bits; its tiles hold no window edge or sequence end
        st = lists.mask(st, visit, tile, offs_n, BLOCK_M)
    st, scale_log2, tanht = score_tail(st, offs_m[None, :], offs_n[:, None], seqlen_q, seqlen_k, sc.qk_scale,
                                       window_left, window_right, sc.softcap_in2, sc.softcap_out, alibi_slope, HAS_LEFT,
                                       HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, MASKED and not lists.on, MASK_REL=True)
    # read from shared memory here, where it is used: loaded earlier it was spilled across the mask arithmetic
    lse = sm.lse.index(stage).load(gl.SliceLayout(0, s_layout))
    pt = gl.exp2(st * scale_log2 - lse[None, :])
    delta = sm.delta.index(stage).load(gl.SliceLayout(0, s_layout))
    return start_m, offs_m, raw, pt, delta, tanht


@gluon.jit
def _step(it, start_m, dk, dv, sm: BwdSmem, sc: Scores, dq_desc, tma_b, dq_row0, off_h, offs_n, seqlen_q, seqlen_k,
          window_left, window_right, alibi_slope, lists: BlockLists, visit, mod: ScoreMod, WG: gl.constexpr,
          BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr,
          STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
          HAS_ALIBI: gl.constexpr, MASKED: gl.constexpr, FUSED_DQ: gl.constexpr, DQ_ROWS: gl.constexpr):
    """One (Q, dO) tile into this warpgroup's dK, dV (and its columns of dQ): the contract of
    portable.backward._dkdv_from_q_tiles."""
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    dyn = it >> 30  # as in _step_cols: no hoisted (spilled) wgmma descriptors
    stage = it % STAGES + dyn
    phase = ready_phase(it, STAGES)
    k_tile = sm.k.index(WG + dyn).reshape([WG_M, BLOCK_D])
    v_tile = sm.v.index(WG + dyn).reshape([WG_M, BLOCK_D])
    q_tile = sm.q.index(stage).reshape([BLOCK_M, BLOCK_D])
    do_tile = sm.do.index(stage).reshape([BLOCK_M, BLOCK_D])
    mbarrier.wait(sm.q_ready.index(stage), phase)
    st_tok = warpgroup_mma(k_tile, q_tile.permute([1, 0]), gl.zeros([WG_M, BLOCK_M], gl.float32, s_layout),
                           use_acc=False, is_async=True)
    mbarrier.wait(sm.do_ready.index(stage), phase)
    dpt_tok = warpgroup_mma(v_tile, do_tile.permute([1, 0]), gl.zeros([WG_M, BLOCK_M], gl.float32, s_layout),
                            use_acc=False, is_async=True)
    start_m, offs_m, raw, pt, delta, tanht = _probs_t(st_tok, start_m, stage, sm, sc, lists, visit, mod, offs_n,
                                                     seqlen_q, seqlen_k, window_left, window_right, alibi_slope,
                                                     BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, MASKED)
    if FUSED_DQ:
        # dS before the dV matmul is issued: P's operand copy is not live beside P, dPᵀ and dK, dV (issuing
        # dV first measured 2-14% slower on the H100, benchmarks/NOTES.md)
        dpt = warpgroup_mma_wait(0, deps=[dpt_tok])
        pt_op = gl.convert_layout(pt.to(q_tile.dtype), p_layout(BLOCK_D))
        dv_tok = warpgroup_mma(pt_op, do_tile, dv, is_async=True)
    else:
        pt_op = gl.convert_layout(pt.to(q_tile.dtype), p_layout(BLOCK_D))
        dv_tok = warpgroup_mma(pt_op, do_tile, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, deps=[dpt_tok])
    dst = _ds_t(pt, dpt, delta, tanht, raw, offs_m, offs_n, mod, HAS_SOFTCAP)
    dst16 = dst.to(q_tile.dtype)
    dst_op = gl.convert_layout(dst16, p_layout(BLOCK_D))
    dk_tok = warpgroup_mma(dst_op, q_tile, dk, is_async=True)
    if FUSED_DQ:
        _dq_tile(it, dst16, sm, dq_desc, tma_b, dq_row0 + start_m, off_h,
                 sc, WG, BLOCK_M, BLOCK_D, DQ_ROWS)
    dv, dk, pt_op, dst_op = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, pt_op, dst_op])
    mbarrier.arrive(sm.empty.index(stage), count=1)
    return dk, dv


@gluon.jit
def _half_probs(st_tok, v_tile, do_tile, start_m, sm: BwdSmem, sc: Scores, lists: BlockLists, visit, mod: ScoreMod,
                offs_n, seqlen_q, seqlen_k, window_left, window_right, alibi_slope, stage, phase, buf,
                WG: gl.constexpr, BLOCK_M: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, MASKED: gl.constexpr):
    """Pᵀ and dSᵀ of this warpgroup's half of the query rows (the SPLIT_D and MLA steps), from its Sᵀ matmul in
    flight (st_tok): dPᵀ = V dOᵀ, the score tail, both put in shared memory and announced on p_ready and ds_ready
    (buffer buf). Returns the tile's first query row (a block mask's visit tile resolved)."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    s_layout: gl.constexpr = wgmma_layout(HALF_M)
    mbarrier.wait(sm.do_ready.index(stage), phase)
    dpt_tok = warpgroup_mma(v_tile, do_tile.slice(WG * HALF_M, HALF_M, dim=0).permute([1, 0]),
                            gl.zeros([WG_M, HALF_M], gl.float32, s_layout), use_acc=False, is_async=True)
    tile = start_m // BLOCK_M  # a visit tile with a block mask
    if lists.on:
        start_m = lists.tile_start(visit, tile, BLOCK_M)
    offs_m = start_m + WG * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(0, s_layout))
    st = warpgroup_mma_wait(1, deps=[st_tok])
    raw = st  # a score_mod's derivative is taken at the raw scores
    st = mod.scores(st, offs_m[None, :], offs_n[:, None])
    if lists.on and MASKED:  # a block mask's bits; its tiles hold no window edge or sequence end
        st = lists.mask(st, visit, tile, offs_n, BLOCK_M, WG * HALF_M)
    st, scale_log2, tanht = score_tail(st, offs_m[None, :], offs_n[:, None], seqlen_q, seqlen_k, sc.qk_scale,
                                       window_left, window_right, sc.softcap_in2, sc.softcap_out, alibi_slope, HAS_LEFT,
                                       HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, MASKED and not lists.on, MASK_REL=True)
    lse = sm.lse.index(stage).slice(WG * HALF_M, HALF_M).load(gl.SliceLayout(0, s_layout))
    pt = gl.exp2(st * scale_log2 - lse[None, :])
    # P and dS are kept query-major ([queries, keys]): each warpgroup's rows are a whole-swizzle slice
    sm.p.index(buf).slice(WG * HALF_M, HALF_M, dim=0).store(gl.permute(pt.to(sm.p.dtype), [1, 0]))
    fence_async_shared()
    mbarrier.arrive(sm.p_ready.index(buf), count=1)
    delta = sm.delta.index(stage).slice(WG * HALF_M, HALF_M).load(gl.SliceLayout(0, s_layout))
    dpt = warpgroup_mma_wait(0, deps=[dpt_tok])
    dst = _ds_t(pt, dpt, delta, tanht, raw, offs_m, offs_n, mod, HAS_SOFTCAP)
    sm.ds.index(buf).slice(WG * HALF_M, HALF_M, dim=0).store(gl.permute(dst.to(sm.ds.dtype), [1, 0]))
    fence_async_shared()
    mbarrier.arrive(sm.ds_ready.index(buf), count=1)
    return start_m


@gluon.jit
def _step_cols(it, start_m, dk, dv, sm: BwdSmem, sc: Scores, dq_desc, tma_b, dq_row0, off_h, offs_n, seqlen_q, seqlen_k,
               window_left, window_right, alibi_slope, lists: BlockLists, visit, mod: ScoreMod, WG: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr,
               STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
               HAS_ALIBI: gl.constexpr, MASKED: gl.constexpr, FUSED_DQ: gl.constexpr):
    """_step for wide heads (SPLIT_D): both warpgroups share the program's 64 keys; each computes Pᵀ and dSᵀ
    for half of the tile's query rows, puts them in shared memory (buffer it % 2, count-2 p_ready and
    ds_ready barriers: the reuse argument of _dq_tile), and then its half of the head dim's columns of dV,
    dK (and dQ) with all operands from shared memory."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    COLS: gl.constexpr = BLOCK_D // 2
    s_layout: gl.constexpr = wgmma_layout(HALF_M)
    # a zero the compiler cannot see through, in every tile index: otherwise the wgmma descriptors of the
    # loop-invariant tiles (16 per 256-deep matmul) are hoisted out of the loop and spilled
    dyn = it >> 30
    stage = it % STAGES + dyn
    phase = ready_phase(it, STAGES)
    buf = it % 2 + dyn
    buf_phase = ready_phase(it, 2)
    k_tile = sm.k.index(dyn).reshape([WG_M, BLOCK_D])
    v_tile = sm.v.index(dyn).reshape([WG_M, BLOCK_D])
    q_tile = sm.q.index(stage).reshape([BLOCK_M, BLOCK_D])
    do_tile = sm.do.index(stage).reshape([BLOCK_M, BLOCK_D])
    mbarrier.wait(sm.q_ready.index(stage), phase)
    st_tok = warpgroup_mma(k_tile, q_tile.slice(WG * HALF_M, HALF_M, dim=0).permute([1, 0]),
                           gl.zeros([WG_M, HALF_M], gl.float32, s_layout), use_acc=False, is_async=True)
    start_m = _half_probs(st_tok, v_tile, do_tile, start_m, sm, sc, lists, visit, mod, offs_n, seqlen_q, seqlen_k,
                          window_left, window_right, alibi_slope, stage, phase, buf, WG, BLOCK_M, HAS_LEFT, HAS_RIGHT,
                          HAS_SOFTCAP, HAS_ALIBI, MASKED)
    mbarrier.wait(sm.p_ready.index(buf), buf_phase)
    dv_tok = warpgroup_mma(sm.p.index(buf).permute([1, 0]), do_tile.slice(WG * COLS, COLS, dim=1), dv,
                           is_async=True)
    mbarrier.wait(sm.ds_ready.index(buf), buf_phase)
    dk_tok = warpgroup_mma(sm.ds.index(buf).permute([1, 0]), q_tile.slice(WG * COLS, COLS, dim=1), dk,
                           is_async=True)
    if FUSED_DQ:
        dq_tok = warpgroup_mma(sm.ds.index(buf), k_tile.slice(WG * COLS, COLS, dim=1),
                               gl.zeros([BLOCK_M, COLS], gl.float32, wgmma_layout(COLS)), use_acc=False,
                               is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dq_tok])
        mbarrier.arrive(sm.empty.index(stage), count=1)
        _dq_add(dq, sm, dq_desc, tma_b, dq_row0 + start_m, off_h, sc, WG, 0, WG * COLS)
    else:
        dv, dk = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok])
        mbarrier.arrive(sm.empty.index(stage), count=1)
    return dk, dv


@gluon.constexpr_function
def mla_split(WG, what):
    """Warpgroup WG's share of a 192/128 step in 64-column chunks, 6.5 of its 13 64x64x64 units each (Sᵀ and dPᵀ
    for half the rows: 2.5): warpgroup 0 dK chunk 0, dV's 128 columns and dQ chunk 0; warpgroup 1 dK chunks 1 and
    2, dQ chunks 1 and 2. "a", "b": the chunk of dK in the first and second accumulator (-1: dV); "dq": dQ's."""
    return {"a": (0, 1), "b": (-1, 2), "dq": ((0,), (1, 2))}[what][WG]


@gluon.jit
def _step_mla(it, start_m, dk, dv, sm: BwdSmem, sc: Scores, dq_desc, tma_b, dq_row0, off_h, offs_n, seqlen_q,
              seqlen_k, window_left, window_right, alibi_slope, lists: BlockLists, visit, mod: ScoreMod,
              WG: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
              HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, MASKED: gl.constexpr,
              FUSED_DQ: gl.constexpr):
    """_step_cols at MLA's 192/128: the program's 64 keys, each warpgroup Pᵀ and dSᵀ for half of the query rows
    (shared through shared memory), Sᵀ over Q's and K's three 64-column buffers, then the warpgroup's chunks by
    mla_split: dk and dv are its two accumulators (dK chunk "a"; dV or dK chunk "b")."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    CH: gl.constexpr = MLA_QK_DIM // MLA_CHUNK
    s_layout: gl.constexpr = wgmma_layout(HALF_M)
    dyn = it >> 30  # as in _step_cols: no hoisted (spilled) wgmma descriptors
    stage = it % STAGES + dyn
    phase = ready_phase(it, STAGES)
    buf = it % 2 + dyn
    buf_phase = ready_phase(it, 2)
    v_tile = sm.v.index(dyn).reshape([WG_M, sm.v.shape[4]])
    do_tile = sm.do.index(stage).reshape([BLOCK_M, sm.do.shape[4]])
    mbarrier.wait(sm.q_ready.index(stage), phase)
    st_tok = gl.zeros([WG_M, HALF_M], gl.float32, s_layout)
    for c in gl.static_range(CH):
        q_rows = sm.q.index(stage * CH + c).reshape([BLOCK_M, MLA_CHUNK]).slice(WG * HALF_M, HALF_M, dim=0)
        st_tok = warpgroup_mma(sm.k.index(c + dyn).reshape([WG_M, MLA_CHUNK]), q_rows.permute([1, 0]), st_tok,
                               use_acc=c > 0, is_async=True)
    # only warpgroup 0 (dV) waits for P
    start_m = _half_probs(st_tok, v_tile, do_tile, start_m, sm, sc, lists, visit, mod, offs_n, seqlen_q, seqlen_k,
                          window_left, window_right, alibi_slope, stage, phase, buf, WG, BLOCK_M, HAS_LEFT, HAS_RIGHT,
                          HAS_SOFTCAP, HAS_ALIBI, MASKED)
    A: gl.constexpr = mla_split(WG, "a")
    B: gl.constexpr = mla_split(WG, "b")
    dst_t = sm.ds.index(buf).permute([1, 0])  # [keys, queries]
    if B < 0:
        mbarrier.wait(sm.p_ready.index(buf), buf_phase)
        b_tok = warpgroup_mma(sm.p.index(buf).permute([1, 0]), do_tile, dv, is_async=True)
        mbarrier.wait(sm.ds_ready.index(buf), buf_phase)
    else:
        mbarrier.wait(sm.ds_ready.index(buf), buf_phase)
        b_tok = warpgroup_mma(dst_t, sm.q.index(stage * CH + B).reshape([BLOCK_M, MLA_CHUNK]), dv, is_async=True)
    a_tok = warpgroup_mma(dst_t, sm.q.index(stage * CH + A).reshape([BLOCK_M, MLA_CHUNK]), dk, is_async=True)
    if FUSED_DQ:
        DQ: gl.constexpr = mla_split(WG, "dq")
        dq_layout: gl.constexpr = wgmma_layout(MLA_CHUNK)
        dq0 = warpgroup_mma(sm.ds.index(buf), sm.k.index(DQ[0] + dyn).reshape([WG_M, MLA_CHUNK]),
                            gl.zeros([BLOCK_M, MLA_CHUNK], gl.float32, dq_layout), use_acc=False, is_async=True)
        if len(DQ) == 1:
            dv, dk, dq0 = warpgroup_mma_wait(0, deps=[b_tok, a_tok, dq0])
            mbarrier.arrive(sm.empty.index(stage), count=1)
            _dq_add(dq0, sm, dq_desc, tma_b, dq_row0 + start_m, off_h, sc, DQ[0], 0, DQ[0] * MLA_CHUNK)
        else:
            dq1 = warpgroup_mma(sm.ds.index(buf), sm.k.index(DQ[1] + dyn).reshape([WG_M, MLA_CHUNK]),
                                gl.zeros([BLOCK_M, MLA_CHUNK], gl.float32, dq_layout), use_acc=False, is_async=True)
            dv, dk, dq0, dq1 = warpgroup_mma_wait(0, deps=[b_tok, a_tok, dq0, dq1])
            mbarrier.arrive(sm.empty.index(stage), count=1)
            # both chunks staged before either reduce-add: one wait for the buffers, not one per chunk
            tma_store_wait(0)
            sm.dq.index(DQ[0]).store(dq0 * sc.softmax_scale)
            sm.dq.index(DQ[1]).store(dq1 * sc.softmax_scale)
            fence_async_shared()
            for j in gl.static_range(2):
                tma_reduce_add(dq_desc, [tma_b, dq_row0 + start_m, off_h, DQ[j] * MLA_CHUNK],
                               sm.dq.index(DQ[j]).reshape([1, BLOCK_M, 1, MLA_CHUNK]))
    else:
        dv, dk = warpgroup_mma_wait(0, deps=[b_tok, a_tok])
        mbarrier.arrive(sm.empty.index(stage), count=1)
    return dk, dv


@gluon.jit
def _dq_chunk(buf, c, sm: BwdSmem, dq_desc, tma_b, dq_row, dq_head, sc: Scores, WG: gl.constexpr,
              BLOCK_M: gl.constexpr):
    """64-column chunk c of a query tile's dQ, dS K over both warpgroups' key halves, reduce-added from this
    warpgroup's staging buffer (_step_mla_wide)."""
    CH: gl.constexpr = MLA_QK_DIM // MLA_CHUNK
    dq = gl.zeros([BLOCK_M, MLA_CHUNK], gl.float32, wgmma_layout(MLA_CHUNK))
    for h in gl.static_range(2):
        dq = warpgroup_mma(sm.ds.index(2 * buf + h).permute([1, 0]),
                           sm.k.index(h * CH + c).reshape([WG_M, MLA_CHUNK]), dq, use_acc=h > 0, is_async=True)
    dq = warpgroup_mma_wait(0, deps=[dq])
    _dq_add(dq, sm, dq_desc, tma_b, dq_row, dq_head, sc, WG, 0, c * MLA_CHUNK)


@gluon.jit
def _dq_chunk_acc_t(buf, c, sm: BwdSmem, BLOCK_M: gl.constexpr):
    """64-column chunk c of a query tile of fewer than 64 rows' dQ, transposed (dQᵀ = Kᵀ dSᵀ, wgmma's M) and
    unscaled, over both warpgroups' key halves."""
    return warpgroup_mma_wait(0, deps=[_dq_chunk_mma_t(buf, c, sm, BLOCK_M)])


@gluon.jit
def _dq_chunk_mma_t(buf, c, sm: BwdSmem, BLOCK_M: gl.constexpr):
    """_dq_chunk_acc_t's matmuls, in flight (the token)."""
    CH: gl.constexpr = MLA_QK_DIM // MLA_CHUNK
    dqt = gl.zeros([MLA_CHUNK, BLOCK_M], gl.float32, wgmma_layout(BLOCK_M))
    for h in gl.static_range(2):
        dqt = warpgroup_mma(sm.k.index(h * CH + c).reshape([WG_M, MLA_CHUNK]).permute([1, 0]),
                            sm.ds.index(2 * buf + h), dqt, use_acc=h > 0, is_async=True)
    return dqt


@gluon.jit
def _dq_pair_t(buf, sm: BwdSmem, BLOCK_M: gl.constexpr):
    """DQ_PAIR: warpgroup 0's chunks 0 and 1 (_dq_chunk_acc_t), both chunks' matmuls in flight before one wait."""
    d0 = _dq_chunk_mma_t(buf, 0, sm, BLOCK_M)
    d1 = _dq_chunk_mma_t(buf, 1, sm, BLOCK_M)
    return warpgroup_mma_wait(0, deps=[d0, d1])


@gluon.jit
def _dq_stage_t(it, buf, start_m, sm: BwdSmem, tma_b, dq_row0, off_h, sc: Scores, WG: gl.constexpr,
                BLOCK_M: gl.constexpr, PAIR: gl.constexpr):
    """DQ_WRITER's consumer half: this warpgroup's dQ chunks of step `it` (_step_mla_wide's split) staged in set
    `buf`, with the tile's address from warpgroup 0; the producer reduce-adds them (_dq_write)."""
    CH: gl.constexpr = MLA_QK_DIM // MLA_CHUNK
    if PAIR and WG == 0:
        d0, d1 = _dq_pair_t(buf, sm, BLOCK_M)
        mbarrier.wait(sm.dq_empty.index(buf), free_phase(it, 2))
        sm.dq.index(buf * CH).permute([1, 0]).store(d0 * sc.softmax_scale)
        sm.dq.index(buf * CH + 1).permute([1, 0]).store(d1 * sc.softmax_scale)
    else:
        for c in gl.static_range(2 * WG, 2 + WG):
            dqt = _dq_chunk_acc_t(buf, c, sm, BLOCK_M)
            if c == 2 * WG:  # the reduce-adds of step it - 2 have read the set
                mbarrier.wait(sm.dq_empty.index(buf), free_phase(it, 2))
            sm.dq.index(buf * CH + c).permute([1, 0]).store(dqt * sc.softmax_scale)
    if WG == 0:
        idx = gl.arange(0, 4, layout=DQ_AT_LAYOUT)
        sm.dq_at.index(buf).store(gl.where(idx == 0, tma_b, gl.where(idx == 1, dq_row0 + start_m, off_h)))
    fence_async_shared()  # the stores visible to the reduce-adds' async proxy, before the barrier says so
    mbarrier.arrive(sm.dq_full.index(buf), count=1)


@gluon.jit
def _dq_chunk_t(buf, c, sm: BwdSmem, dq_desc, tma_b, dq_row, dq_head, sc: Scores, SLOT: gl.constexpr,
                BLOCK_M: gl.constexpr, PENDING: gl.constexpr = 0):
    """_dq_chunk for query tiles of fewer than 64 rows (wgmma's M): dQᵀ = Kᵀ dSᵀ, stored transposed in staging
    buffer SLOT for the reduce-add. PENDING: reduce-adds that may stay in flight (the older ones, this buffer's
    last among them, have read their buffers)."""
    _dq_store_t(_dq_chunk_acc_t(buf, c, sm, BLOCK_M), sm, dq_desc, tma_b, dq_row, dq_head, c, sc, SLOT, BLOCK_M,
                PENDING)


@gluon.jit
def _dq_store_t(dqt, sm: BwdSmem, dq_desc, tma_b, dq_row, dq_head, c, sc: Scores, SLOT: gl.constexpr,
                BLOCK_M: gl.constexpr, PENDING: gl.constexpr):
    """Stage dQᵀ chunk c (scaled) in buffer SLOT once the reduce-adds beyond PENDING have read theirs, and
    reduce-add it from there."""
    tma_store_wait(PENDING)
    sm.dq.index(SLOT).permute([1, 0]).store(dqt * sc.softmax_scale)
    fence_async_shared()
    tma_reduce_add(dq_desc, [tma_b, dq_row, dq_head, c * MLA_CHUNK],
                   sm.dq.index(SLOT).reshape([1, BLOCK_M, 1, MLA_CHUNK]))


@gluon.jit
def _step_mla_wide(it, start_m, dk, dv, sm: BwdSmem, sc: Scores, dq_desc, tma_b, dq_row0, off_h, offs_n, seqlen_q,
                   seqlen_k, window_left, window_right, alibi_slope, lists: BlockLists, visit, mod: ScoreMod,
                   WG: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
                   HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr,
                   MASKED: gl.constexpr, FUSED_DQ: gl.constexpr, PAIR_DQ: gl.constexpr = False):
    """_step at MLA's 192/128 with 128-key items (MLA without SPLIT_D; FREE_REGS for its registers): this
    warpgroup's 64 keys, Sᵀ over Q's and K's three 64-column buffers, dK as three [64, 64] accumulators (dk, a
    tuple), dV at 128 columns; dQ in 64-column chunks, warpgroup 0 chunks 0 and 1 and warpgroup 1 chunk 2.
    It halves the dQ reduce-adds and the Q/dO reads per FLOP of the 64-key items, which the ncu profile showed
    L2-bound (benchmarks/NOTES.md)."""
    CH: gl.constexpr = MLA_QK_DIM // MLA_CHUNK
    V_W: gl.constexpr = sm.v.shape[4]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    dyn = it >> 30  # as in _step_cols: no hoisted (spilled) wgmma descriptors
    stage = it % STAGES + dyn
    phase = ready_phase(it, STAGES)
    v_tile = sm.v.index(WG + dyn).reshape([WG_M, V_W])
    do_tile = sm.do.index(stage).reshape([BLOCK_M, V_W])
    mbarrier.wait(sm.q_ready.index(stage), phase)
    st_tok = gl.zeros([WG_M, BLOCK_M], gl.float32, s_layout)
    for c in gl.static_range(CH):
        q_c = sm.q.index(stage * CH + c).reshape([BLOCK_M, MLA_CHUNK])
        st_tok = warpgroup_mma(sm.k.index(WG * CH + c + dyn).reshape([WG_M, MLA_CHUNK]), q_c.permute([1, 0]),
                               st_tok, use_acc=c > 0, is_async=True)
    mbarrier.wait(sm.do_ready.index(stage), phase)
    dpt_tok = warpgroup_mma(v_tile, do_tile.permute([1, 0]), gl.zeros([WG_M, BLOCK_M], gl.float32, s_layout),
                            use_acc=False, is_async=True)
    start_m, offs_m, raw, pt, delta, tanht = _probs_t(st_tok, start_m, stage, sm, sc, lists, visit, mod, offs_n,
                                                     seqlen_q, seqlen_k, window_left, window_right, alibi_slope,
                                                     BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, MASKED)
    dpt = warpgroup_mma_wait(0, deps=[dpt_tok])
    # dS before P's operand (at 64-row tiles either order spilled alike; 32-row tiles fit)
    dst = _ds_t(pt, dpt, delta, tanht, raw, offs_m, offs_n, mod, HAS_SOFTCAP)
    pt_op = gl.convert_layout(pt.to(do_tile.dtype), p_layout(V_W))
    dv_tok = warpgroup_mma(pt_op, do_tile, dv, is_async=True)
    dst16 = dst.to(do_tile.dtype)
    dst_op = gl.convert_layout(dst16, p_layout(MLA_CHUNK))
    dk0, dk1, dk2 = dk
    t0 = warpgroup_mma(dst_op, sm.q.index(stage * CH).reshape([BLOCK_M, MLA_CHUNK]), dk0, is_async=True)
    t1 = warpgroup_mma(dst_op, sm.q.index(stage * CH + 1).reshape([BLOCK_M, MLA_CHUNK]), dk1, is_async=True)
    t2 = warpgroup_mma(dst_op, sm.q.index(stage * CH + 2).reshape([BLOCK_M, MLA_CHUNK]), dk2, is_async=True)
    buf = it % 2 + dyn
    if FUSED_DQ:
        # this warpgroup's dSᵀ half for both warpgroups' dQ chunks (buffer reuse as in _dq_tile)
        sm.ds.index(2 * buf + WG).store(dst16)
        fence_async_shared()
        mbarrier.arrive(sm.ds_ready.index(buf), count=1)
    # dK and dV retire before dQ's accumulator is live: their operands' registers are free for it
    dv, dk0, dk1, dk2, pt_op, dst_op = warpgroup_mma_wait(0, deps=[dv_tok, t0, t1, t2, pt_op, dst_op])
    mbarrier.arrive(sm.empty.index(stage), count=1)
    if FUSED_DQ:
        mbarrier.wait(sm.ds_ready.index(buf), ready_phase(it, 2))
        # warpgroup 0 chunks 0 and 1, warpgroup 1 chunk 2 (a branch on the step's parity spilled the accumulators;
        # chunk 2 split by keys, a reduce-add from each warpgroup, ran 8-12% slower)
        SPARE: gl.constexpr = sm.dq.shape[0] == 3  # DQ_SPARE_SLOT: chunk 1 in slot 2, not waiting for chunk 0's
        WRITER: gl.constexpr = sm.dq.shape[0] == 2 * CH  # DQ_WRITER: two sets of all chunks
        if WRITER:  # the producer reduce-adds them
            _dq_stage_t(it, buf, start_m, sm, tma_b, dq_row0, off_h, sc, WG, BLOCK_M, PAIR_DQ)
        elif PAIR_DQ and WG == 0 and SPARE and BLOCK_M < 64:
            d0, d1 = _dq_pair_t(buf, sm, BLOCK_M)  # each chunk waits only for its own slot's last reduce-add
            _dq_store_t(d0, sm, dq_desc, tma_b, dq_row0 + start_m, off_h, 0, sc, 0, BLOCK_M, 1)
            _dq_store_t(d1, sm, dq_desc, tma_b, dq_row0 + start_m, off_h, 1, sc, 2, BLOCK_M, 1)
        else:
            for c in gl.static_range(2 * WG, 2 + WG):
                if BLOCK_M < 64:
                    _dq_chunk_t(buf, c, sm, dq_desc, tma_b, dq_row0 + start_m, off_h, sc,
                                2 if SPARE and c != 2 * WG else WG, BLOCK_M, 1 - WG if SPARE else 0)
                else:
                    _dq_chunk(buf, c, sm, dq_desc, tma_b, dq_row0 + start_m, off_h, sc, WG, BLOCK_M)
    return (dk0, dk1, dk2), dv


@gluon.jit
def _tile(it, start_m, dk, dv, sm: BwdSmem, sc: Scores, dq_desc, tma_b, dq_row0, off_h, offs_n, seqlen_q, seqlen_k,
          window_left, window_right, alibi_slope, lists: BlockLists, visit, mod: ScoreMod, WG: gl.constexpr,
          BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr,
          STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
          HAS_ALIBI: gl.constexpr, MASKED: gl.constexpr, FUSED_DQ: gl.constexpr, SPLIT_D: gl.constexpr,
          DQ_ROWS: gl.constexpr, MLA: gl.constexpr = False, PAIR_DQ: gl.constexpr = False):
    if MLA and not SPLIT_D:
        dk, dv = _step_mla_wide(it, start_m, dk, dv, sm, sc, dq_desc, tma_b, dq_row0, off_h, offs_n, seqlen_q,
                                seqlen_k, window_left, window_right, alibi_slope, lists, visit, mod, WG, BLOCK_M,
                                STAGES, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, MASKED, FUSED_DQ, PAIR_DQ)
    elif MLA:
        dk, dv = _step_mla(it, start_m, dk, dv, sm, sc, dq_desc, tma_b, dq_row0, off_h, offs_n, seqlen_q, seqlen_k,
                           window_left, window_right, alibi_slope, lists, visit, mod, WG, BLOCK_M, STAGES, HAS_LEFT,
                           HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, MASKED, FUSED_DQ)
    elif SPLIT_D:
        dk, dv = _step_cols(it, start_m, dk, dv, sm, sc, dq_desc, tma_b, dq_row0, off_h, offs_n, seqlen_q, seqlen_k,
                            window_left, window_right, alibi_slope, lists, visit, mod, WG, BLOCK_M, BLOCK_D,
                            STAGES,
                            HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, MASKED, FUSED_DQ)
    else:
        dk, dv = _step(it, start_m, dk, dv, sm, sc, dq_desc, tma_b, dq_row0, off_h, offs_n, seqlen_q, seqlen_k,
                       window_left, window_right, alibi_slope, lists, visit, mod, WG, BLOCK_M, BLOCK_D, STAGES,
                       HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, MASKED, FUSED_DQ, DQ_ROWS)
    return dk, dv


@gluon.jit
def _consumer(WG: gl.constexpr, sm: BwdSmem, sc: Scores, grid: WorkGrid, lists: BlockLists, mod: ScoreMod, dq_desc,
              dK, dV,
              AlibiSlopes, stride_dkb,
              stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh, stride_alibi_b, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
              HAS_RIGHT: gl.constexpr, IS_VARLEN: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr,
              FUSED_DQ: gl.constexpr, SPLIT_D: gl.constexpr, DQ_ROWS: gl.constexpr, COALESCED_DKV: gl.constexpr,
              MLA: gl.constexpr = False, PAIR_DQ: gl.constexpr = False):
    # this warpgroup's block of dK and dV: 64 keys of the program's 128 with the whole head dim, or (SPLIT_D)
    # the program's 64 keys with half the head dim's columns, or (MLA) mla_split's chunks: `dv` holds dK's chunk
    # "b" where B_IS_DK
    WIDE: gl.constexpr = MLA and not SPLIT_D  # _step_mla_wide: dk a tuple of three 64-column chunks
    B_IS_DK: gl.constexpr = MLA and not WIDE and mla_split(WG, "b") >= 0
    if WIDE:
        key_off: gl.constexpr = WG * WG_M
        col0: gl.constexpr = 0
        COLS: gl.constexpr = MLA_CHUNK
        v_col0: gl.constexpr = 0
        V_COLS: gl.constexpr = sm.v.shape[4]
        K_DIM: gl.constexpr = MLA_QK_DIM
        V_DIM: gl.constexpr = sm.v.shape[4]
        s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    elif MLA:
        key_off: gl.constexpr = 0
        col0: gl.constexpr = mla_split(WG, "a") * MLA_CHUNK
        COLS: gl.constexpr = MLA_CHUNK
        v_col0: gl.constexpr = mla_split(WG, "b") * MLA_CHUNK if B_IS_DK else 0
        V_COLS: gl.constexpr = MLA_CHUNK if B_IS_DK else sm.v.shape[4]
        K_DIM: gl.constexpr = MLA_QK_DIM
        V_DIM: gl.constexpr = MLA_QK_DIM if B_IS_DK else sm.v.shape[4]
        s_layout: gl.constexpr = wgmma_layout(BLOCK_M // 2)
    elif SPLIT_D:
        key_off: gl.constexpr = 0
        col0: gl.constexpr = WG * (BLOCK_D // 2)
        COLS: gl.constexpr = BLOCK_D // 2
        v_col0: gl.constexpr = col0
        V_COLS: gl.constexpr = COLS
        K_DIM: gl.constexpr = BLOCK_D
        V_DIM: gl.constexpr = BLOCK_D
        s_layout: gl.constexpr = wgmma_layout(BLOCK_M // 2)
    else:
        key_off: gl.constexpr = WG * WG_M
        col0: gl.constexpr = 0
        COLS: gl.constexpr = BLOCK_D
        v_col0: gl.constexpr = 0
        V_COLS: gl.constexpr = COLS
        K_DIM: gl.constexpr = BLOCK_D
        V_DIM: gl.constexpr = BLOCK_D
        s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    o_layout: gl.constexpr = wgmma_layout(COLS)
    ov_layout: gl.constexpr = wgmma_layout(V_COLS)
    it = 0  # Q/dO ring slot, counted across work items as the producer counts it
    done = 0  # work items finished, for the K/V barriers' phases
    first, last, step = grid.steps()
    for tile in range(first, last, step):
        off_b, off_hk, start_n, q_start, n_rows, k_start, n_keys, m_lo, m_full_lo, m_full_hi, m_hi = _work_item(
            tile, grid, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, IS_VARLEN)
        if start_n < n_keys:
            tma_b = tma_batch(off_b, IS_VARLEN)
            key0 = start_n + key_off
            offs_n = key0 + gl.arange(0, WG_M, layout=gl.SliceLayout(1, s_layout))
            if WIDE:
                zero = gl.zeros([WG_M, COLS], gl.float32, o_layout)
                dk = (zero, zero, zero)
            else:
                dk = gl.zeros([WG_M, COLS], gl.float32, o_layout)
            dv = gl.zeros([WG_M, V_COLS], gl.float32, ov_layout)
            mbarrier.wait(sm.kv_bar, ready_phase(done, 1))
            for g in range(0, grid.group):
                off_h = off_hk * grid.group + g
                alibi_slope = alibi_slope_of(AlibiSlopes, off_b, off_h, stride_alibi_b, HAS_ALIBI)
                # query tiles the diagonal (window's right edge) or a sequence end crosses (masked), tiles that
                # see the whole key tile, then tiles cut by the window's left edge (masked)
                # (a block mask's partial query blocks' tiles first, masked, then its full ones: _head_ranges)
                bounds = _head_ranges(lists, off_b, off_h, start_n, m_lo, m_full_lo, m_full_hi, m_hi, BLOCK_M)
                for r in gl.static_range(3):
                    for start_m in range(bounds[r], bounds[r + 1], BLOCK_M):
                        dk, dv = _tile(it, start_m, dk, dv, sm, sc, dq_desc, tma_b, q_start, off_h, offs_n, n_rows,
                                       n_keys, grid.window_left, grid.window_right, alibi_slope, lists, bounds[4],
                                       mod.at(off_b, off_h), WG, BLOCK_M, BLOCK_D,
                                       STAGES, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, r != 1, FUSED_DQ, SPLIT_D,
                                       DQ_ROWS, MLA, PAIR_DQ)
                        it += 1
            # every matmul of this warpgroup that read K or V has retired (each step waits for its own): the
            # producer may load the next work item's while this one's dK and dV go out
            mbarrier.arrive(sm.kv_empty, count=1)
            if WIDE:  # dK's chunks 1 and 2, scaled as below; chunk 0 leaves through the shared path
                rows_c = key0 + gl.arange(0, WG_M, layout=gl.SliceLayout(1, o_layout))
                rows_c64 = (k_start + rows_c).to(gl.int64)[:, None]
                for c in gl.static_range(1, MLA_QK_DIM // MLA_CHUNK):
                    cols_c = c * MLA_CHUNK + gl.arange(0, MLA_CHUNK, layout=gl.SliceLayout(0, o_layout))
                    gl.store(dK + off_b.to(gl.int64) * stride_dkb + off_hk.to(gl.int64) * stride_dkh
                             + rows_c64 * stride_dkn + cols_c[None, :],
                             (dk[c] * sc.softmax_scale).to(dK.dtype.element_ty), mask=(rows_c[:, None] < n_keys))
                dk = dk[0]
            # dK = scale * dSᵀ Q: the softmax scale is applied once, here
            dk_out = (dk * sc.softmax_scale).to(dK.dtype.element_ty)
            if B_IS_DK:
                dv_out = (dv * sc.softmax_scale).to(dK.dtype.element_ty)
            else:
                dv_out = dv.to(dV.dtype.element_ty)
            if COALESCED_DKV:
                # through shared memory into 16-byte row pieces: the accumulator layout's 4-byte pieces
                # write partial sectors
                TPW_N: gl.constexpr = min(COLS // 8, 32)
                out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPW_N, TPW_N], [4, 1], [1, 0])
                dk_out = gl.convert_layout(dk_out, out_layout)
                dv_out = gl.convert_layout(dv_out, out_layout)
                outv_layout: gl.constexpr = out_layout
            else:
                out_layout: gl.constexpr = o_layout
                outv_layout: gl.constexpr = ov_layout
            rows = key0 + gl.arange(0, WG_M, layout=gl.SliceLayout(1, out_layout))
            cols = col0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, out_layout))
            mask = (rows[:, None] < n_keys) & (cols[None, :] < K_DIM)
            rows64 = (k_start + rows).to(gl.int64)[:, None]
            dk_ptrs = (dK + off_b.to(gl.int64) * stride_dkb + off_hk.to(gl.int64) * stride_dkh + rows64 * stride_dkn
                       + cols[None, :])
            gl.store(dk_ptrs, dk_out, mask=mask)
            rows_v = key0 + gl.arange(0, WG_M, layout=gl.SliceLayout(1, outv_layout))
            cols_v = v_col0 + gl.arange(0, V_COLS, layout=gl.SliceLayout(0, outv_layout))
            if B_IS_DK:
                dv_ptrs = (dK + off_b.to(gl.int64) * stride_dkb + off_hk.to(gl.int64) * stride_dkh
                           + (k_start + rows_v).to(gl.int64)[:, None] * stride_dkn + cols_v[None, :])
            else:
                dv_ptrs = (dV + off_b.to(gl.int64) * stride_dvb + off_hk.to(gl.int64) * stride_dvh
                           + (k_start + rows_v).to(gl.int64)[:, None] * stride_dvn + cols_v[None, :])
            gl.store(dv_ptrs, dv_out, mask=(rows_v[:, None] < n_keys) & (cols_v[None, :] < V_DIM))
            done += 1
    if FUSED_DQ:
        tma_store_wait(0)  # the last reduce-add reads sm.dq until it completes


@gluon.jit(do_not_specialize=ROW_COUNTS)
def attention_bwd_sm90_kernel(
    q_desc, k_desc, v_desc, do_desc, dq_desc, Lse, Delta, dK, dV, CuSeqlensQ, CuSeqlensK, AlibiSlopes,
    stride_dk, stride_dv, stride_lse, stride_alibi_b,
    nheads, nheads_k, seqlen_q, seqlen_k, total_q, total_k, qk_scale, softmax_scale, window_left,
    window_right, softcap_in2, softcap_out, num_tiles, section,
    BLOCK_M: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
    IS_VARLEN: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, FUSED_DQ: gl.constexpr,
    SPLIT_D: gl.constexpr, DQ_ROWS: gl.constexpr, COALESCED_DKV: gl.constexpr,
    QNum=None, QIndices=None, PartialIds=None, FullNum=None, FullIndices=None, MaskBits=None, stride_num=None,
    stride_idx=None, SPARSE_Q: gl.constexpr = 128, SPARSE_KV: gl.constexpr = 128,
    MOD_FN: gl.constexpr = None, MOD_GRAD: gl.constexpr = None, captures=None, MLA: gl.constexpr = False,
    FREE_REGS: gl.constexpr = False, Schedule=None, DQ_SPARE_SLOT: gl.constexpr = False,
    DQ_WRITER: gl.constexpr = False, DQ_PAIR: gl.constexpr = False,
):
    """dK and dV of key tiles of one kv head, summed over its query heads (GQA): the contract of
    portable.backward.attention_bwd_dkdv_kernel without dropout; with FUSED_DQ also each tile's part of dQ, added
    into dq_desc's fp32 buffer (pre-scaled by softmax_scale). Key tiles of 128 (a 64-key half per
    warpgroup), or with SPLIT_D of 64 (half the head dim per warpgroup). The work items are the (key tile,
    batch x kv head) pairs; program i takes items i, i + grid, ... (a persistent grid when the launch is
    smaller than the work: the producer then loads the next item's K and V while the consumers write the
    last one's dK and dV), or with a Schedule (a persistent causal grid) the items of its row of that table.
    Descriptors as in forward.py. stride_dk, stride_dv: (batch, row, head) strides;
    stride_lse: Lse's and Delta's (batch, head).

    Block-sparse mode (QNum given; flex_attention): each key tile visits the query blocks of a BlockMask's q view
    for each query head (BlockLists with BY_KEY), partial blocks masked by MaskBits; arguments as the forward's.
    Lse is FlexAttention's (-inf for rows that see no key). A score_mod (MOD_FN and its derivative MOD_GRAD,
    captures: its tensors; qk_scale then log2(e)) applies as in the forward, with dS times its derivative.
    MLA (with SPLIT_D): query/key head dim 192, value head dim 128 (_step_mla); q/k_desc and dq_desc hand out
    64-column tiles, v/do_desc 128-column ones. MLA without SPLIT_D (CONFIGS_MLA, the default): 128-key items
    (_step_mla_wide); DQ_WRITER (with it): the producer warpgroup issues the dQ reduce-adds (_dq_write)."""
    stride_dkb, stride_dkn, stride_dkh = stride_dk
    stride_dvb, stride_dvn, stride_dvh = stride_dv
    stride_lse_b, stride_lse_h = stride_lse
    BLOCK_D: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_N: gl.constexpr = WG_M if SPLIT_D else 2 * WG_M
    dtype: gl.constexpr = q_desc.dtype
    grid = WorkGrid(gl.cdiv(seqlen_k, BLOCK_N), num_tiles, section, nheads_k, nheads // nheads_k, CuSeqlensQ,
                    CuSeqlensK, seqlen_q, seqlen_k, total_q, total_k, window_left, window_right, Schedule)
    if QNum is None:
        lists = BlockLists(None, None, None, None, None, None, None, None, None, None, None, SPARSE_Q, SPARSE_KV,
                           True)
    else:
        lists = BlockLists(QNum, QIndices, PartialIds, FullNum, FullIndices, MaskBits, stride_num[0], stride_num[1],
                           stride_idx[0], stride_idx[1], stride_idx[2], SPARSE_Q, SPARSE_KV, True)

    # MLA: Q and K in QK_CHUNKS buffers of 64 columns (Gluon's shapes are powers of two), V and dO at 128
    QK_CHUNKS: gl.constexpr = MLA_QK_DIM // MLA_CHUNK if MLA else 1
    WRITER: gl.constexpr = DQ_WRITER and MLA and FUSED_DQ and not SPLIT_D
    V_W: gl.constexpr = v_desc.block_type.shape[3]
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N // WG_M * QK_CHUNKS, 1, WG_M, 1, BLOCK_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N // WG_M, 1, WG_M, 1, V_W], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES * QK_CHUNKS, 1, BLOCK_M, 1, BLOCK_D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_M, 1, V_W], do_desc.layout)
    if SPLIT_D:
        # P and dS of the tile ([queries, keys], two buffers), shared by the warpgroups
        pds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, WG_M], dtype)
        p_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, WG_M], pds_layout)
        ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, WG_M], pds_layout)
    elif FUSED_DQ:
        # dSᵀ halves, two buffers x two warpgroups
        ds_smem = gl.allocate_shared_memory(dtype, [4, WG_M, BLOCK_M],
                                            gl.NVMMASharedLayout.get_default_for([WG_M, BLOCK_M], dtype))
        p_smem = ds_smem
    else:
        ds_smem = q_smem
        p_smem = q_smem
    if FUSED_DQ:
        # each warpgroup's block of the tile's dQ for its reduce-add: half the columns, or (DQ_ROWS) half the rows,
        # or (MLA) a buffer per 64-column chunk
        DQ_M: gl.constexpr = BLOCK_M // 2 if DQ_ROWS else BLOCK_M
        DQ_N: gl.constexpr = MLA_CHUNK if MLA else (BLOCK_D if DQ_ROWS else BLOCK_D // 2)
        # (DQ_SPARE_SLOT: a third, DQ_WRITER: two sets of the three chunks; _step_mla_wide reads which from their
        # count)
        DQ_BUFS: gl.constexpr = QK_CHUNKS if MLA and SPLIT_D else (2 * QK_CHUNKS if WRITER else
                                                                   (3 if DQ_SPARE_SLOT else 2))
        dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_BUFS, DQ_M, DQ_N],
                                            gl.NVMMASharedLayout.get_default_for([DQ_M, DQ_N], gl.float32))
    else:
        dq_smem = q_smem
    rows_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], rows_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], rows_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    if WRITER:
        dq_at = gl.allocate_shared_memory(gl.int32, [2, 4], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(dq_full.index(i), count=2)
            mbarrier.init(dq_empty.index(i), count=1)
    else:
        dq_at = ds_ready
        dq_full = ds_ready
        dq_empty = ds_ready
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(kv_empty, count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=2)  # dO's bytes, and the producer's lse and Delta rows
        mbarrier.init(empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)
        mbarrier.init(p_ready.index(i), count=2)
    fence_async_shared()  # the inits visible to the async proxy (TMA's complete-tx), as CUDA's TMA guide fences

    sm = BwdSmem(k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, lse_smem, delta_smem, kv_bar, kv_empty,
                 q_ready, do_ready, empty, p_ready, ds_ready, dq_at, dq_full, dq_empty)
    sc = Scores(qk_scale, softmax_scale, softcap_in2, softcap_out)
    mod = ScoreMod(MOD_FN, MOD_GRAD, captures, softmax_scale)
    gl.warp_specialize([
        (_producer, (q_desc, k_desc, v_desc, do_desc, dq_desc, sm, Lse, Delta, stride_lse_b, stride_lse_h, grid, lists,
                     BLOCK_M, BLOCK_N, STAGES, HAS_LEFT, HAS_RIGHT, IS_VARLEN, WRITER)),
        (_consumer, (0, sm, sc, grid, lists, mod, dq_desc, dK, dV, AlibiSlopes, stride_dkb, stride_dkn, stride_dkh,
                     stride_dvb, stride_dvn, stride_dvh, stride_alibi_b, BLOCK_M, BLOCK_N, BLOCK_D, STAGES, HAS_LEFT,
                     HAS_RIGHT, IS_VARLEN, HAS_SOFTCAP, HAS_ALIBI, FUSED_DQ, SPLIT_D, DQ_ROWS, COALESCED_DKV, MLA,
                     DQ_PAIR)),
        (_consumer, (1, sm, sc, grid, lists, mod, dq_desc, dK, dV, AlibiSlopes, stride_dkb, stride_dkn, stride_dkh,
                     stride_dvb, stride_dvn, stride_dvh, stride_alibi_b, BLOCK_M, BLOCK_N, BLOCK_D, STAGES, HAS_LEFT,
                     HAS_RIGHT, IS_VARLEN, HAS_SOFTCAP, HAS_ALIBI, FUSED_DQ, SPLIT_D, DQ_ROWS, COALESCED_DKV, MLA,
                     DQ_PAIR)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])

    mbarrier.invalidate(kv_bar)
    mbarrier.invalidate(kv_empty)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(q_ready.index(i))
        mbarrier.invalidate(do_ready.index(i))
        mbarrier.invalidate(empty.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(ds_ready.index(i))
        mbarrier.invalidate(p_ready.index(i))
        if WRITER:
            mbarrier.invalidate(dq_full.index(i))
            mbarrier.invalidate(dq_empty.index(i))


def dq_block(tuning: dict, head_dim: int) -> list[int]:
    """Each warpgroup's block of a dQ reduce-add: half of a query tile's columns, or with DQ_ROWS half its rows."""
    if tuning["DQ_ROWS"]:
        return [1, tuning["BLOCK_M"] // 2, 1, head_dim]
    return [1, tuning["BLOCK_M"], 1, head_dim // 2]


def tuning_for(head_dim: int, opts: AttnOptions, head_dim_v: int | None = None, rows: int | None = None) -> dict:
    """The kernel's tuning for a call: deterministic calls take the dK/dV-only kernel and the dQ pass; a value head
    dim unlike the query's CONFIGS_MLA's entry (without the fused dQ when deterministic), with
    CONFIGS_MLA_SHORT_CAUSAL's keys for dense causal calls of at most its `rows` (query rows)."""
    if head_dim_v not in (None, head_dim):
        tuning = dict(CONFIGS_MLA[(head_dim, head_dim_v)], FUSED_DQ=not opts.deterministic)
        max_rows, short = CONFIGS_MLA_SHORT_CAUSAL.get((head_dim, head_dim_v), (0, {}))
        if (opts.window_right >= 0 and not opts.varlen and not opts.deterministic and rows is not None
                and rows <= max_rows):
            tuning.update(short)
        return tuning
    return (CONFIGS_DKDV if opts.deterministic else CONFIGS)[head_dim]


def can_implement(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  opts: AttnOptions) -> str | None:
    """None when this kernel computes the call's dK and dV, else what keeps them on the Triton kernel."""
    if v.shape[-1] != q.shape[-1]:  # MLA: _step_mla
        if (q.shape[-1], v.shape[-1]) not in CONFIGS_MLA:
            return (f"a value head dim unlike the query's: {q.shape[-1]}/{v.shape[-1]} (the Gluon backward has "
                    f"{sorted(CONFIGS_MLA)})")
        return sm90_declines(q, [q.shape[-1]], "backward", opts.dropout_p > 0.0, k, v, dout, unlike_v=2)
    return sm90_declines(q, CONFIGS, "backward", opts.dropout_p > 0.0, k, v, dout)


# where "auto" takes this kernel: with dQ fused it measured faster than the Triton backward on every cell (head
# dims 64 and 128, 1k-16k tokens, causal or not; at 128 also fp16, softcap, ALiBi, a 4k window, packed
# documents; at 256 1.4-1.9x, bf16; H100, 2026-11-24, benchmarks/NOTES.md)
AUTO_HEAD_DIMS = (64, 128, 256)
# except calls with a right window edge (causal) and fewer query rows than this, by head dim. Packed calls: at 512
# the Triton backward was 1.02-1.03x faster at head dims 64 and 128 (its programs hold few query tiles, so this
# kernel's pipeline fill shows); at 256 this kernel was 1.21x faster (fp16, H100). Dense calls take the scheduled
# persistent grid (PERSISTENT_CAUSAL), which at 512 ran 1.25x / 1.26x the Triton backward at 64 / 128 (bf16, H200,
# 2026-11-27); shorter ones were not measured
AUTO_CAUSAL_MIN_ROWS = {64: 512, 128: 512, 256: 0}
AUTO_CAUSAL_MIN_ROWS_PACKED = {64: 1024, 128: 1024, 256: 0}
# deterministic calls (the dK/dV-only kernel with the Triton dQ pass) where that measured faster than the
# Triton backward: 1.2-1.3x at head dim 256; at 64 0.93-0.96x, at 128 0.95-1.04x (H100)
AUTO_DETERMINISTIC_HEAD_DIMS = (256,)
# MLA's 192/128 (a query head dim 192 reaches here only with it): CONFIGS_MLA ran 1.03-1.08x cuDNN's time causal
# at 2k-16k, where the Triton backward ran 1.91-2.07x (bf16, H100, 2026-11-25)
AUTO_MLA_QUERY_DIMS = (192,)


def auto_declines(q: torch.Tensor, opts: AttnOptions) -> str | None:
    """Why "auto" keeps a call this kernel can run on the Triton kernels."""
    head_dim = q.shape[-1]
    if head_dim not in AUTO_HEAD_DIMS + AUTO_MLA_QUERY_DIMS:
        return f"head dim {head_dim}: not measured faster than the Triton backward (FLASHATTN2_BACKEND=gluon)"
    rows = opts.max_seqlen_q if opts.varlen else q.shape[1]
    min_rows = AUTO_CAUSAL_MIN_ROWS_PACKED if opts.varlen else AUTO_CAUSAL_MIN_ROWS
    if opts.window_right >= 0 and rows < min_rows.get(head_dim, 0):
        return f"a right window edge with {rows} query rows: the Triton backward is faster"
    if opts.deterministic and head_dim not in AUTO_DETERMINISTIC_HEAD_DIMS:
        return "deterministic: the Triton backward is as fast (FLASHATTN2_BACKEND=gluon takes this one)"
    return None


class Sm90Backward:
    """The Gluon launch of a backward plan (portable/backward.py): dK and dV, and with `fused_dq` dQ as well (into
    an fp32 buffer the plan zeroes and converts); else the plan's dQ kernel computes dQ."""

    def __init__(self, dout, q, k, v, lse, opts: AttnOptions) -> None:
        batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim = problem_dims(q, k, opts)
        head_dim_v = v.shape[-1]
        mla = head_dim_v != head_dim
        tuning = dict(tuning_for(head_dim, opts, head_dim_v, seqlen_q))
        persistent = tuning.pop("PERSISTENT")
        persistent_causal = tuning.pop("PERSISTENT_CAUSAL", False)
        l2_share = tuning.pop("L2_SECTIONS")  # 1/n of L2 per section; 0: no sections
        placed = tuning.pop("PLACED_SCHEDULE", False)
        free_regs = tuning.setdefault("FREE_REGS", False)
        self.fused_dq = tuning["FUSED_DQ"]
        qk_width = int(MLA_CHUNK) if mla else head_dim  # MLA: Q and K in 64-column tiles
        self.q_block = [1, tuning["BLOCK_M"], 1, qk_width]
        self.kv_block = [1, int(WG_M), 1, qk_width]
        self.v_block = [1, int(WG_M), 1, head_dim_v]
        self.do_block = [1, tuning["BLOCK_M"], 1, head_dim_v]
        self.dq_block = [1, tuning["BLOCK_M"], 1, int(MLA_CHUNK)] if mla else dq_block(tuning, head_dim)
        self.q_layout = shared_layout(self.q_block, q.dtype)
        self.kv_layout = shared_layout(self.kv_block, q.dtype)
        self.v_layout = shared_layout(self.v_block, q.dtype)
        self.do_layout = shared_layout(self.do_block, q.dtype)
        self.dq_layout = shared_layout(self.dq_block, torch.float32)
        if mla:
            tuning["MLA"] = True
        stride_dk, stride_dv = (row_strides(torch.empty(x.shape, device="meta"), opts.varlen) for x in (k, v))
        # keys per work item, a host int: numpy (the schedule's costs) takes no constexpr
        block_n = WG_M.value if tuning["SPLIT_D"] else 2 * WG_M.value
        num_tiles = grid = cdiv(seqlen_k, block_n) * batch * nheads_k
        # causal items differ in cost: a persistent grid for them takes a host-made schedule (PERSISTENT_CAUSAL),
        # which a CUDA graph capture cannot copy to the GPU and packed batches cannot cost on the host
        scheduled = (persistent and persistent_causal and opts.window_right >= 0 and not opts.varlen and
                     0 < num_tiles <= MAX_SCHEDULED_ITEMS and
                     not (q.is_cuda and torch.cuda.is_current_stream_capturing()))
        if persistent and (opts.window_right < 0 and not opts.varlen or scheduled):
            # one program per SM (the shared memory allows no second), each looping over work items: equal ones,
            # or the schedule's; otherwise causal and packed items keep one program per item
            grid = min(num_tiles, torch.cuda.get_device_properties(q.device).multi_processor_count)
        section = 1
        if l2_share and (grid == num_tiles or scheduled):
            # a kv head's items stream its query heads' Q, dO (input dtype) and dQ (fp32) rows
            section = l2_section(nheads // nheads_k * seqlen_q * head_dim * (2 * q.element_size() + 4), q.device,
                                 l2_share)
        self.schedule = None
        if scheduled:
            costs = causal_walk_costs(cdiv(seqlen_k, block_n), batch * nheads_k, section, seqlen_q, seqlen_k, opts,
                                      tuning["BLOCK_M"], block_n, nheads // nheads_k)
            table = schedule_items(costs, grid)
            if placed:  # WorkGrid reads an int64 table as places
                table = decoded_schedule(table, grid, cdiv(seqlen_k, block_n), batch * nheads_k, section, nheads_k,
                                         reverse=False)
            self.schedule = torch.from_numpy(table).to(q.device)
        named = dict(stride_dk=stride_dk, stride_dv=stride_dv, stride_lse=lse_strides(lse, opts.varlen),
                     nheads=nheads, nheads_k=nheads_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k, total_q=q.shape[0],
                     total_k=k.shape[0], softmax_scale=opts.softmax_scale, num_tiles=num_tiles, section=section,
                     Schedule=self.schedule, **opts.kernel_args(), **tuning)
        self.launch = Launch(attention_bwd_sm90_kernel, (max(grid, 1), 1, 1), (), named, num_warps=4, num_stages=1,
                             options=dict(maxnreg=MAXNREG), compiling=free_registers if free_regs else None)

    def __call__(self, dout, q, k, v, lse, delta, dq_acc, dk, dv, opts: AttnOptions) -> None:
        """dq_acc: with fused_dq, a zeroed fp32 tensor shaped like q that receives softmax_scale * dQ."""
        cu_q, cu_k, alibi, _ = opts.tensors()
        q_desc = descriptor(q, self.q_block, self.q_layout)
        dq_desc = descriptor(dq_acc, self.dq_block, self.dq_layout) if self.fused_dq else q_desc
        self.launch(q_desc, descriptor(k, self.kv_block, self.kv_layout),
                    descriptor(v, self.v_block, self.v_layout),
                    descriptor(dout, self.do_block, self.do_layout), dq_desc, lse, delta, dk, dv, cu_q, cu_k,
                    alibi)


# the block-sparse mode's list arguments (BlockLists over the mask's q view)
SPARSE_LISTS = ("QNum", "QIndices", "PartialIds", "FullNum", "FullIndices", "MaskBits")


def compile_for_sm90(head_dim: int, dtype: torch.dtype = torch.bfloat16, score_mod=None, head_dim_v: int | None = None,
                     **flags: bool):
    """forward.compile_for_sm90 for this kernel; FUSED_DQ=False compiles the deterministic dK/dV-only one,
    BLOCK_SPARSE=True the block-sparse mode (score_mod: a score_mod.CompiledMod with it), SCHEDULED=True a
    persistent causal grid's schedule table (int64 with PLACED_SCHEDULE=True), head_dim_v (unlike head_dim) the MLA
    variant."""
    fused = flags.get("FUSED_DQ", True)
    mla = head_dim_v not in (None, head_dim)
    config = CONFIGS_MLA[(head_dim, head_dim_v)] if mla else (CONFIGS if fused else CONFIGS_DKDV)[head_dim]
    constants = dict(dict(FREE_REGS=False, DQ_SPARE_SLOT=False, DQ_WRITER=False, DQ_PAIR=False), **config,
                     HAS_LEFT=False, HAS_RIGHT=False, MLA=mla, IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False,
                     SPARSE_Q=128, SPARSE_KV=128)
    block_sparse = flags.pop("BLOCK_SPARSE", False)
    scheduled = flags.pop("SCHEDULED", False)
    if not block_sparse:
        constants.update(dict.fromkeys(SPARSE_LISTS + ("stride_num", "stride_idx")))
    if not scheduled:
        constants["Schedule"] = None
    constants.update(flags)
    placed = constants.get("PLACED_SCHEDULE", False)  # the table's type
    for key in HOST_TUNING_KEYS:  # launch-grid choices, not kernel flags
        constants.pop(key, None)
    block_m = constants["BLOCK_M"]
    types = dict(Lse="*fp32", Delta="*fp32", dK="*DTYPE", dV="*DTYPE", CuSeqlensQ="*i32", CuSeqlensK="*i32",
                 AlibiSlopes="*fp32", qk_scale="fp32", softmax_scale="fp32", softcap_in2="fp32", softcap_out="fp32")
    if block_sparse:
        types.update(dict.fromkeys(SPARSE_LISTS, "*i32"))
    if scheduled:
        types["Schedule"] = "*i64" if placed else "*i32"
    mod_signature(score_mod, constants, types)
    descriptors = dict(q_desc=block_m, k_desc=64, v_desc=64, do_desc=block_m)
    if mla:
        descriptors = dict(q_desc=[1, block_m, 1, int(MLA_CHUNK)], k_desc=[1, 64, 1, int(MLA_CHUNK)],
                           v_desc=[1, 64, 1, head_dim_v], do_desc=[1, block_m, 1, head_dim_v])
    if fused:
        block = dq_block(constants, head_dim) if not mla else [1, block_m, 1, int(MLA_CHUNK)]
        layout = shared_layout(block, torch.float32)
        types["dq_desc"] = f"tensordesc<fp32[{','.join(map(str, block))}],{layout!r}>"
    else:
        descriptors["dq_desc"] = descriptors["q_desc"]  # unused
    return compile_gluon(attention_bwd_sm90_kernel, dtype, head_dim, descriptors, types, constants, MAXNREG,
                         constants["FREE_REGS"])
