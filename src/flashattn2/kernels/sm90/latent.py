"""Decoding over MLA's latent cache on Hopper (issue 27): query/key head dim 576, value head dim 512, the value cache
the key cache's first 512 channels (one kv head, 64-128 query heads). FlashMLA's shape, in Gluon:

- a program takes 64 query heads of one query position and a range of keys (split-KV: combine.py merges the
  ranges' fp32 partials, as for the Triton KV-cache kernel);
- Q once and each 64-key tile of the cache once come by TMA (nine 64-column boxes into a [64, 512] and a [64, 64]
  buffer), two stages;
- one warpgroup issues those loads, computes S = Q Kᵀ over the 576 columns and the online softmax, and hands P
  (bf16) and the rows' rescale factors over through shared memory;
- four warpgroups each own a quarter of O ([64, 128] fp32: 64 registers a thread) and add P V with V the key tile's
  first 512 columns, so the cache is read once for both products.

Per tile the scores warpgroup does 53% of the matmul work and each value warpgroup 12%; the tensor cores are the
SM's, so what counts is that their issue overlaps: S of tile i + 1 runs under P V of tile i. FlashMLA splits O over
two warpgroups of 128 registers' accumulators; here four of 64 (VALUE_WGS). SCORE_WGS=2 gives the scores to two
warpgroups on alternate tiles, so that one tile's softmax runs beside the next tile's S. SEESAW=1 is FlashMLA's
split: a loader warp and two warpgroups, each with half of O and the scores of every other tile, handing each other
P and the row maxima (the comment above _seesaw_loader); every call takes it by default (tuning_for).

The contract is kvcache_attention_kernel's for the calls `can_implement` takes; key rows of the last tile past the
sequence (the cache's unwritten capacity may hold anything) are zeroed in shared memory before P V reads them, since
P = 0 does not clear a NaN."""

import torch

from .. import common
from ..common import cdiv, runs_sm90a
from ..launch import Launch
from ..portable.kvcache import cache_geometry, cache_sequence
from ..tma import tma_usable
from .common import descriptor, free_phase, free_registers, p_layout, ready_phase, wgmma_layout
from .gluon_api import (
    aggregate,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    shared_layout,
    tma_load,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LATENT_QK, LATENT_V, CHUNK = gl.constexpr(576), gl.constexpr(512), gl.constexpr(64)
HALF_CHUNKS = gl.constexpr(4)  # the 64-column chunks of O's first 256 columns (EARLY_FREE's first half)
HEADS = gl.constexpr(64)  # query heads per program (rows of S and O)
# keys per tile: 32 keys in 4 stages (more bytes in flight) measured 0.70-0.75x the speed: S = Q Kᵀ as m64n32
# wgmmas reads 21 bytes of shared memory per 64 FLOP, past what shared memory feeds the tensor cores
BLOCK_N = gl.constexpr(64)
STAGES = gl.constexpr(2)  # key tiles in flight: Q 72 KB + 2 x 72 KB + P 8 KB of the 227 KB
# value warpgroups, each with O's columns [WG x 512 / VALUE_WGS, + 512 / VALUE_WGS). ptxas allocates every partition
# within PTX's .maxnreg, the launch's cap (common.free_registers lifts it). Four of [64, 128] (64 registers of O a
# thread): 20 warps (with the scores warpgroup, which also issues the loads) at 96 fill the 64K registers. Two of
# [64, 256] (FlashMLA's split: one m64n256 wgmma a tile, 128 registers of O; 154 registers measured): 12 warps at
# 168. VALUE_WGS is the launch's choice (LATENT_TUNING); 2 measured within 2-3% of 4 (NOTES.md).
MAXNREG = {4: 96, 2: 168}
# EARLY_LOAD: the scores warpgroup issues the load of tile i + 1 right after S_i's wgmmas (it waits for the value
# warpgroups to free the stage while they run) instead of after S_i's softmax. ncu (H100, batch 64, 16k keys) had
# it waiting for its key tile 17.5% of its time: with two stages the load of tile i + 1 went out only after tile
# i's scores. Measured (H100, two runs, batch 8-64, 16k-64k keys): +3 to +10% on every row but one (batch 64, 64k
# dense: -10% in one run, level in the other); 0.61-0.65 of the copy bandwidth from batch 8 at 64k keys.
# SCORE_WGS=2 (with VALUE_WGS=2; tuning_for's choice from SPLIT_SCORES_FROM when SEESAW_LONG=0): two scores warpgroups
# take alternate key tiles, each with its own stage, so that S and the softmax of one tile run beside those of the next;
# they hand each other only the running row maxima (m_x, m_bar). P goes into its stage's tail columns, dead once S is
# out (the value warpgroups read the first 512), so no P buffer is needed: 16 warps, the launch's cap 128, and the
# partitions sized by setmaxnreg (common.free_registers): scores SPLIT_SCORE_REGS, values SPLIT_VALUE_REGS. sm_90
# (triton 3.6): no spills at 96 / 160 (scores at 88-112 spilled until Q's descriptors went through the loop's runtime
# zero; values at 144-152 spilled), 104 HGMMA, 224 KB of shared memory.
# SPLIT_SCORES_FROM (a host key): calls with this many keys per program (capacity / splits) or more take the seesaw
# (SEESAW_LONG), first SCORE_WGS=2 with VALUE_WGS=2 (tuning_for), which measured: H200, two runs in both orders
# (2026-11-27): +2 to +28% at batch 64 (4k-64k keys, one split) and at batch 8 with 64k keys (8k a split); -6% and -7%
# at batch 8 with 16k keys (2k a split); batch 1 launch-bound either way
# SEESAW=1 (FlashMLA's "seesaw"): a loader warp and two consumer warpgroups, each owning half of O's columns
# ([64, 256], two [64, 128] halves) and computing S for alternate tiles of a pair: WG0 S of tile 2j, WG1 of 2j + 1
# at the same time; each hands its P (bf16, into its stage's tail columns as SCORE_WGS=2 does) and row maxima to
# the other and adds both tiles' P V to its half, its own P from registers. It overrides SCORE_WGS / VALUE_WGS
# (tuning_for keeps them at the defaults). 12 warps as launched (the loader's warpgroup padded): the cap 168 and
# setmaxnreg (common.free_registers): consumers SEESAW_REGS, the loader SEESAW_LOAD_REGS.
# SEESAW_LONG (a host key): calls past SPLIT_SCORES_FROM take SEESAW=1 instead of SCORE_WGS=2. Dense, measured in
# both orders (2026-11-28, batch 64 at 4k-64k keys and batch 8 at 64k): +0.5 to +5% on the H100, two runs (0.64-0.70
# of the copy bandwidth to 0.66-0.74), and on the H200, four runs, +2 to +12% in 14 rows of 16. Paged, once the
# loader read the block table before its stage wait (_load_tile; eighteenth session): against SCORE_WGS=2 at batch
# 64, H100 two runs 0 to +11% (6 of 6 rows level or faster), H200 four runs +3 to +9% in 11 rows of 12 (one -5%).
# SPLIT_SCORES_FROM 0, the seesaw for every call (4096 before: the split calls of batches 1-32, 125-2k keys a
# program, took one scores warpgroup). Kernel time (CUDA-graph replay) over one scores warpgroup's, H200, three runs
# (2026-11-29, benchmarks/NOTES.md thirty-first session): 0.81-0.96 at 256-2k keys a program (batch 8 16k 0.82-0.87,
# batch 32 4k 0.81-0.86), 0.96-0.98 at 128-249 (batch 1-2 at 4k-16k), level where the seesaw ran already
# READY_PARTS (SEESAW): a key tile's nine 64-column loads complete on this many barriers (1, 2, 3 or 9; part p the
# chunks [9p / PARTS, 9(p + 1) / PARTS)), so that S's wgmmas start on a tile's first columns while the rest land (a
# stage is reloaded only once both consumers are done with it, so each S waited for its whole 72 KB).
# EARLY_FREE (SEESAW, READY_PARTS 2 or 9): a stage's columns 0-255 and 256-575 freed apart, each as soon as the
# warpgroups reading them are done: stage 0's first half after WG0's P_a V alone (its rows are WG0's O columns), so
# the next tile's first half loads while WG1 still makes P_b. The seesaw's default READY_PARTS=2 with EARLY_FREE
# (tuning_for gives the other schedules 1 and 0): H100, four runs in four orders (nineteenth session), batch 64 at
# 4k-64k keys -1.5 to -5% time (median by row), batch 8 at 64k -3 to -4%, the rest level; READY_PARTS=3 alone -1 to -4%
LATENT_TUNING = dict(VALUE_WGS=4, EARLY_LOAD=True, SCORE_WGS=1, SEESAW=0, SPLIT_SCORES_FROM=0, SEESAW_LONG=1,
                     READY_PARTS=2, EARLY_FREE=1)
HOST_KEYS = ("SPLIT_SCORES_FROM", "SEESAW_LONG")
SPLIT_SCORE_REGS, SPLIT_VALUE_REGS = gl.constexpr(96), gl.constexpr(160)
SEESAW_REGS, SEESAW_LOAD_REGS = gl.constexpr(240), gl.constexpr(24)


def tuning_for(capacity: int | None, num_splits: int = 1) -> dict:
    """The kernel's constexprs for a call (LATENT_TUNING without its host keys): from SPLIT_SCORES_FROM keys a
    program the seesaw (SEESAW_LONG) or two scores warpgroups (static shapes only: no sync). capacity None:
    LATENT_TUNING's own schedule, without that rule (one scores warpgroup unless SEESAW)."""
    tuning = {k: v for k, v in LATENT_TUNING.items() if k not in HOST_KEYS}
    if (not tuning.get("SEESAW") and capacity is not None
            and cdiv(capacity, num_splits) >= LATENT_TUNING["SPLIT_SCORES_FROM"]):
        if LATENT_TUNING["SEESAW_LONG"]:
            tuning.update(SEESAW=1)
        else:
            tuning.update(VALUE_WGS=2, SCORE_WGS=2)
    if not tuning["SEESAW"]:  # only the seesaw's loads and frees are split
        tuning.update(READY_PARTS=1, EARLY_FREE=0)
    return tuning


def launch_registers(tuning: dict) -> tuple[int, bool]:
    """(the launch's register cap, whether it compiles under common.free_registers) for a LATENT_TUNING."""
    if tuning.get("SEESAW"):  # 12 warps (9, the loader's warpgroup padded) x 32 x 168 within the 64K
        return 168, True
    if tuning["SCORE_WGS"] == 2:
        if tuning["VALUE_WGS"] != 2:
            raise ValueError("the latent kernel's SCORE_WGS=2 runs with VALUE_WGS=2")
        return 128, True
    return MAXNREG[tuning["VALUE_WGS"]], False


@aggregate
class LatentSmem:
    """Q (its first 512 columns and the tail), the key tiles' ring (same split), P, the rows' rescale factors and
    final sums, and the barriers: q_bar (Q loaded), kv_ready / kv_empty (a key tile loaded / read by every
    value warpgroups), p_ready / p_free (P and the factors written / read), done (the sums written). With SCORE_WGS=2:
    alpha and p_ready by stage, P in k_tail, stats the two warpgroups' (m, m, l, l), m_x / m_bar the running row
    maxima they hand over (with one scores warpgroup: alpha and done again, unused). With SEESAW: P in k_tail, p_ready
    by stage, m_x the pair's two running maxima, stats the two partial sums (alpha, p_free, m_bar: unused)."""
    q: gl.shared_memory_descriptor
    q_tail: gl.shared_memory_descriptor
    k: gl.shared_memory_descriptor
    k_tail: gl.shared_memory_descriptor
    p: gl.shared_memory_descriptor
    alpha: gl.shared_memory_descriptor
    stats: gl.shared_memory_descriptor
    q_bar: gl.shared_memory_descriptor
    kv_ready: gl.shared_memory_descriptor
    kv_empty: gl.shared_memory_descriptor
    p_ready: gl.shared_memory_descriptor
    p_free: gl.shared_memory_descriptor
    done: gl.shared_memory_descriptor
    m_x: gl.shared_memory_descriptor
    m_bar: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, q, q_tail, k, k_tail, p, alpha, stats, q_bar, kv_ready, kv_empty, p_ready, p_free, done, m_x,
                 m_bar):
        self.q = q
        self.q_tail = q_tail
        self.k = k
        self.k_tail = k_tail
        self.p = p
        self.alpha = alpha
        self.stats = stats
        self.q_bar = q_bar
        self.kv_ready = kv_ready
        self.kv_empty = kv_empty
        self.p_ready = p_ready
        self.p_free = p_free
        self.done = done
        self.m_x = m_x
        self.m_bar = m_bar


@aggregate
class LatentWork:
    """One program's work: its batch entry, first query head, query position, cache row, key range [n_lo, n_hi)
    (n_hi also the end of the keys it sees) and the sequence's failed checks (cache_sequence's bits)."""
    off_b: gl.tensor
    head0: gl.tensor
    q_pos: gl.tensor
    kv_row: gl.tensor
    n_lo: gl.tensor
    n_hi: gl.tensor
    bits: gl.tensor

    @gluon.constexpr_function
    def __init__(self, off_b, head0, q_pos, kv_row, n_lo, n_hi, bits):
        self.off_b = off_b
        self.head0 = head0
        self.q_pos = q_pos
        self.kv_row = kv_row
        self.n_lo = n_lo
        self.n_hi = n_hi
        self.bits = bits


@gluon.jit
def _work(CacheSeqlens, CacheBatchIdx, nheads, seqlen_q, capacity, cache_rows, NUM_SPLITS: gl.constexpr,
          HAS_RIGHT: gl.constexpr, HAS_SEQLENS: gl.constexpr, HAS_BATCH_IDX: gl.constexpr):
    """The program's LatentWork: program (query position, batch x head slot, split). Causal (HAS_RIGHT): query
    position i of seqlen_q sees keys up to i + seqlen_k - seqlen_q (bottom-right aligned)."""
    q_pos = gl.program_id(0)
    slots = nheads // HEADS
    off_b = gl.program_id(1) // slots
    head0 = (gl.program_id(1) % slots) * HEADS
    split = gl.program_id(2)
    cache_len, _, kv_row, bits = cache_sequence(off_b, CacheSeqlens, None, CacheBatchIdx, 0, capacity, cache_rows,
                                                HAS_SEQLENS, False, HAS_BATCH_IDX)
    seqlen_k = gl.where(bits != 0, 0, cache_len).to(gl.int32)
    n_hi = seqlen_k
    if HAS_RIGHT:
        n_hi = gl.maximum(gl.minimum(n_hi, q_pos + 1 + seqlen_k - seqlen_q), 0)
    n_lo = n_hi * 0
    if NUM_SPLITS > 1:
        per_split = gl.cdiv(gl.cdiv(n_hi, BLOCK_N), NUM_SPLITS) * BLOCK_N
        n_lo = split * per_split
        n_hi = gl.minimum(n_hi, n_lo + per_split)
    return LatentWork(off_b, head0, q_pos, kv_row.to(gl.int32), n_lo, n_hi, bits)


@gluon.jit
def _page(BlockTable, stride_bt, kv_row, start_n, page_size, num_pages, PAGED: gl.constexpr):
    """(cache coordinate 0, row) of key start_n's tile and whether its block-table entry is out of range (then page
    0 is read, and the sequence's outputs become NaN). Paged tiles lie in one page (page_size % BLOCK_N == 0)."""
    if PAGED:
        page = gl.load(BlockTable + kv_row.to(gl.int64) * stride_bt + start_n // page_size)
        bad = (page < 0) | (page >= num_pages)
        return gl.where(bad, 0, page), start_n % page_size, bad
    else:
        return kv_row, start_n, start_n < 0


@gluon.jit
def _load_q(q_desc, sm: LatentSmem, w: LatentWork, LEAD: gl.constexpr = False):
    """Q into sm.q and sm.q_tail (LEAD: buffers with a leading dim of 1, as SEESAW's)."""
    MAIN: gl.constexpr = LATENT_V // CHUNK
    q = sm.q
    q_tail = sm.q_tail
    if LEAD:
        q = sm.q.index(0)
        q_tail = sm.q_tail.index(0)
    mbarrier.expect(sm.q_bar, (MAIN + 1) * q_desc.block_type.nbytes)
    for c in gl.static_range(MAIN):
        tma_load(q_desc, [w.off_b, w.q_pos, w.head0, c * CHUNK], sm.q_bar, q.slice(c * CHUNK, CHUNK, dim=3))
    tma_load(q_desc, [w.off_b, w.q_pos, w.head0, LATENT_V], sm.q_bar, q_tail)


@gluon.constexpr_function
def _first_chunk(part, parts):
    """The first of READY_PARTS part `part`'s 64-column chunks (of the tile's nine; part `parts`: past the last)."""
    return part * (LATENT_QK // CHUNK) // parts


@gluon.jit
def _load_tile(k_desc, sm: LatentSmem, w: LatentWork, i, BlockTable, stride_bt, page_size, num_pages,
               PAGED: gl.constexpr, PARTS: gl.constexpr = 1, EARLY_FREE: gl.constexpr = 0):
    """Key tile i of the program's range into its stage, once every value warpgroup has read the stage's last tile
    (nothing past the range); its nine 64-column loads on PARTS barriers of the stage (READY_PARTS), with
    EARLY_FREE each half once its own empty barrier (stage x 2 + half) says so."""
    MAIN: gl.constexpr = LATENT_V // CHUNK
    # EARLY_FREE's second half must start a part (chunk HALF_CHUNKS): 2 parts or 9
    gl.static_assert(not EARLY_FREE or PARTS == 2 or PARTS == 9, "EARLY_FREE needs READY_PARTS 2 or 9")
    start_n = w.n_lo + i * BLOCK_N
    if start_n < w.n_hi:
        stage = i % STAGES
        # the block table's entry before the wait: its load's latency under the wait, not between it and the TMA
        outer, row, _ = _page(BlockTable, stride_bt, w.kv_row, start_n, page_size, num_pages, PAGED)
        if not EARLY_FREE:
            mbarrier.wait(sm.kv_empty.index(stage), free_phase(i, STAGES))
        for part in gl.static_range(PARTS):
            if EARLY_FREE:
                if _first_chunk(part, PARTS) == 0:
                    mbarrier.wait(sm.kv_empty.index(stage * 2), free_phase(i, STAGES))
                if _first_chunk(part, PARTS) == HALF_CHUNKS:
                    mbarrier.wait(sm.kv_empty.index(stage * 2 + 1), free_phase(i, STAGES))
            bar = sm.kv_ready.index(stage * PARTS + part)
            mbarrier.expect(bar, (_first_chunk(part + 1, PARTS) - _first_chunk(part, PARTS)) * k_desc.block_type.nbytes)
            for c in gl.static_range(_first_chunk(part, PARTS), _first_chunk(part + 1, PARTS)):
                if c < MAIN:
                    tma_load(k_desc, [outer, row, 0, c * CHUNK], bar, sm.k.index(stage).slice(c * CHUNK, CHUNK, dim=3))
                else:
                    tma_load(k_desc, [outer, row, 0, LATENT_V], bar, sm.k_tail.index(stage))


@gluon.jit
def _zero_rows_from(tile, first):
    """Zero rows first.. of a [BLOCK_N, 512] shared key tile, 64 columns at a time (the value warpgroups read them)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    for c in gl.static_range(LATENT_V // CHUNK):
        part = tile.slice(c * CHUNK, CHUNK, dim=1)
        x = part.load(layout)
        part.store(gl.where(rows[:, None] < first, x, gl.zeros_like(x)))


@gluon.jit
def _issue_s(q, q_tail, k, k_tail):
    """S = Q Kᵀ of a key tile over the 512 + 64 columns, issued (warpgroup_mma_wait gives it)."""
    s = warpgroup_mma(q, k.permute([1, 0]), gl.zeros([HEADS, BLOCK_N], gl.float32, wgmma_layout(BLOCK_N)),
                      use_acc=False, is_async=True)
    return warpgroup_mma(q_tail, k_tail.permute([1, 0]), s, is_async=True)


@gluon.jit
def _scaled(s, start_n, n_hi, qk_scale):
    """A tile's S in log2 units, -inf for keys n_hi and past."""
    keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, wgmma_layout(BLOCK_N)))
    return gl.where((keys < n_hi)[None, :], s * qk_scale, float("-inf"))


@gluon.jit
def _scores(q_desc, k_desc, sm: LatentSmem, w: LatentWork, Lse, Flag, BlockTable, stride_lse, stride_bt, qk_scale,
            page_size, num_pages, FLAG_WORD: gl.constexpr, NUM_SPLITS: gl.constexpr, PAGED: gl.constexpr,
            EARLY_LOAD: gl.constexpr):
    """S = Q Kᵀ of each tile, the online softmax, P and the rows' rescale factors to the value warpgroups; at the
    end the rows' sums l and lse (NaN for a sequence that failed a check). It also issues the TMA loads: a loader
    warp would make 21 warps, which the launch rounds to 24, and 24 x 32 threads at 96 registers pass the 64K."""
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    dtype: gl.constexpr = sm.p.dtype
    m_i = gl.full([HEADS], float("-inf"), gl.float32, rows_layout)
    l_i = gl.zeros([HEADS], gl.float32, rows_layout)
    bad_page = w.bits * 0
    q = sm.q.reshape([HEADS, LATENT_V])
    q_tail = sm.q_tail.reshape([HEADS, CHUNK])
    _load_q(q_desc, sm, w)
    for j in gl.static_range(STAGES):
        _load_tile(k_desc, sm, w, j, BlockTable, stride_bt, page_size, num_pages, PAGED)
    mbarrier.wait(sm.q_bar, 0)
    i = 0
    for start_n in range(w.n_lo, w.n_hi, BLOCK_N):
        stage = i % STAGES
        dyn = i >> 30  # a zero the compiler cannot see through: no hoisted (spilled) wgmma descriptors
        k = sm.k.index(stage + dyn).reshape([BLOCK_N, LATENT_V])
        k_tail = sm.k_tail.index(stage + dyn).reshape([BLOCK_N, CHUNK])
        mbarrier.wait(sm.kv_ready.index(stage), ready_phase(i, STAGES))
        s = _issue_s(q, q_tail, k, k_tail)
        if EARLY_LOAD and i > 0:  # under S_i's wgmmas; the stage is free once P V of tile i - 1 is done
            _load_tile(k_desc, sm, w, i - 1 + STAGES, BlockTable, stride_bt, page_size, num_pages, PAGED)
        _, _, bad = _page(BlockTable, stride_bt, w.kv_row, start_n, page_size, num_pages, PAGED)
        bad_page |= bad.to(gl.int32)
        s = warpgroup_mma_wait(0, deps=[s])
        s = _scaled(s, start_n, w.n_hi, qk_scale)
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        if start_n + BLOCK_N > w.n_hi:  # the last tile: rows past the sequence may hold anything
            _zero_rows_from(k, w.n_hi - start_n)
        # the value warpgroups have read the last P and factors, hence tile i - 1: its stage takes tile i - 1 + STAGES
        mbarrier.wait(sm.p_free, free_phase(i, 1))
        if not EARLY_LOAD and i > 0:
            _load_tile(k_desc, sm, w, i - 1 + STAGES, BlockTable, stride_bt, page_size, num_pages, PAGED)
        sm.p.store(p.to(dtype))
        sm.alpha.store(alpha)
        fence_async_shared()
        mbarrier.arrive(sm.p_ready, count=1)
        i += 1
    failed = (w.bits | (bad_page << 4)) != 0
    if failed:
        gl.store(Flag + FLAG_WORD, w.bits | (bad_page << 4))
        l_i = gl.full([HEADS], float("nan"), gl.float32, rows_layout)
    sm.stats.store(l_i)
    fence_async_shared()
    mbarrier.arrive(sm.done, count=1)
    empty = l_i == 0.0
    lse = (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * 0.6931471805599453
    # a row that sees no key: the merge's -inf in a partial, the attention functions' +inf in a final output
    lse = gl.where(empty, float("-inf") if NUM_SPLITS > 1 else float("inf"), lse)
    stride_ls, stride_lb, stride_lm, stride_lh = stride_lse
    heads = w.head0 + gl.arange(0, HEADS, layout=rows_layout)
    split = gl.program_id(2)
    gl.store(Lse + split.to(gl.int64) * stride_ls + w.off_b.to(gl.int64) * stride_lb + w.q_pos.to(gl.int64) * stride_lm
             + heads.to(gl.int64) * stride_lh, lse)


@gluon.jit
def _values(WG: gl.constexpr, VALUE_WGS: gl.constexpr, sm: LatentSmem, w: LatentWork, Out, stride_o):
    """O[:, WG * COLS : + COLS] += P V over the tiles (COLS = 512 / VALUE_WGS), rescaled by the scores warpgroup's
    factors; then O / l out."""
    COLS: gl.constexpr = LATENT_V // VALUE_WGS
    o_layout: gl.constexpr = wgmma_layout(COLS)
    rows_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    o = gl.zeros([HEADS, COLS], gl.float32, o_layout)
    i = 0
    for _start_n in range(w.n_lo, w.n_hi, BLOCK_N):
        stage = i % STAGES
        dyn = i >> 30
        v = sm.k.index(stage + dyn).reshape([BLOCK_N, LATENT_V]).slice(WG * COLS, COLS, dim=1)
        mbarrier.wait(sm.p_ready, ready_phase(i, 1))
        alpha = sm.alpha.load(rows_layout)
        o = warpgroup_mma(sm.p, v, o * alpha[:, None], is_async=True)
        o = warpgroup_mma_wait(0, deps=[o])
        mbarrier.arrive(sm.p_free, count=1)
        mbarrier.arrive(sm.kv_empty.index(stage), count=1)
        i += 1
    mbarrier.wait(sm.done, 0)
    l_i = sm.stats.load(rows_layout)
    o = o / gl.where(l_i == 0.0, 1.0, l_i)[:, None]
    stride_os, stride_ob, stride_om, stride_oh = stride_o
    heads = w.head0 + gl.arange(0, HEADS, layout=rows_layout)
    cols = WG * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(0, o_layout))
    split = gl.program_id(2)
    base = Out + split.to(gl.int64) * stride_os + w.off_b.to(gl.int64) * stride_ob + w.q_pos.to(gl.int64) * stride_om
    gl.store(base + heads.to(gl.int64)[:, None] * stride_oh + cols[None, :], o.to(Out.dtype.element_ty))


@gluon.jit
def _scores_split(W: gl.constexpr, q_desc, k_desc, sm: LatentSmem, w: LatentWork, Flag, BlockTable, stride_bt,
                  qk_scale, page_size, num_pages, FLAG_WORD: gl.constexpr, PAGED: gl.constexpr):
    """SCORE_WGS=2: scores warpgroup W takes key tiles W, W + 2, ... in stage W. Per tile: S, its row maxima against
    the running maxima through the tile before (from the other warpgroup: m_x, m_bar), P into the stage's tail
    columns and O's factor into alpha[W]; then the stage's next tile once the value warpgroups are done with it. At
    the end its (m, l) into stats (l NaN for a sequence that failed a check)."""
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    dtype: gl.constexpr = sm.q.dtype
    m_w = gl.full([HEADS], float("-inf"), gl.float32, rows_layout)
    l_w = gl.zeros([HEADS], gl.float32, rows_layout)
    bad_page = w.bits * 0
    if W == 0:  # _load_q into the leading-dim views
        mbarrier.expect(sm.q_bar, (LATENT_V // CHUNK + 1) * q_desc.block_type.nbytes)
        for c in gl.static_range(LATENT_V // CHUNK):
            tma_load(q_desc, [w.off_b, w.q_pos, w.head0, c * CHUNK], sm.q_bar,
                     sm.q.index(0).slice(c * CHUNK, CHUNK, dim=3))
        tma_load(q_desc, [w.off_b, w.q_pos, w.head0, LATENT_V], sm.q_bar, sm.q_tail.index(0))
    _load_tile(k_desc, sm, w, W, BlockTable, stride_bt, page_size, num_pages, PAGED)
    mbarrier.wait(sm.q_bar, 0)
    n_tiles = gl.cdiv(w.n_hi - w.n_lo, BLOCK_N)
    for i in range(W, n_tiles, 2):
        start_n = w.n_lo + i * BLOCK_N
        dyn = i >> 30  # as in _scores
        # Q's descriptors through dyn too: hoisted out of the loop they spilled at 96 registers
        q = sm.q.index(dyn).reshape([HEADS, LATENT_V])
        q_tail = sm.q_tail.index(dyn).reshape([HEADS, CHUNK])
        k = sm.k.index(W + dyn).reshape([BLOCK_N, LATENT_V])
        k_tail = sm.k_tail.index(W + dyn).reshape([BLOCK_N, CHUNK])
        mbarrier.wait(sm.kv_ready.index(W), (i // 2) & 1)
        s = _issue_s(q, q_tail, k, k_tail)
        _, _, bad = _page(BlockTable, stride_bt, w.kv_row, start_n, page_size, num_pages, PAGED)
        bad_page |= bad.to(gl.int32)
        s = warpgroup_mma_wait(0, deps=[s])
        s = _scaled(s, start_n, w.n_hi, qk_scale)
        m_prev = gl.full([HEADS], float("-inf"), gl.float32, rows_layout)
        if i > 0:  # the maxima through tile i - 1: the other warpgroup's ((i - 1) // 2)-th hand-over
            mbarrier.wait(sm.m_bar.index(1 - W), ((i - 1) // 2) & 1)
            m_prev = sm.m_x.slice((1 - W) * HEADS, HEADS).load(rows_layout)
        m_new = gl.maximum(m_prev, gl.max(s, 1))
        sm.m_x.slice(W * HEADS, HEADS).store(m_new)
        mbarrier.arrive(sm.m_bar.index(W), count=1)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_use[:, None])
        l_w = l_w * gl.exp2(m_w - m_use) + gl.sum(p, 1)
        m_w = m_new
        if start_n + BLOCK_N > w.n_hi:  # the last tile: rows past the sequence may hold anything
            _zero_rows_from(k, w.n_hi - start_n)
        k_tail.store(p.to(dtype))  # S is out: the tail columns take P
        sm.alpha.slice(W * HEADS, HEADS).store(gl.exp2(m_prev - m_use))
        fence_async_shared()
        mbarrier.arrive(sm.p_ready.index(W), count=1)
        _load_tile(k_desc, sm, w, i + 2, BlockTable, stride_bt, page_size, num_pages, PAGED)
    failed = (w.bits | (bad_page << 4)) != 0
    if failed:
        gl.atomic_or(Flag + FLAG_WORD, w.bits | (bad_page << 4))  # both warpgroups may report
        l_w = gl.full([HEADS], float("nan"), gl.float32, rows_layout)
    sm.stats.slice(W * HEADS, HEADS).store(m_w)
    sm.stats.slice((2 + W) * HEADS, HEADS).store(l_w)
    fence_async_shared()
    mbarrier.arrive(sm.done, count=1)


# the value warpgroups' O in [64, 128] halves: ptxas checks each instruction's registers against the launch's 128
# (.reqntid 512) even inside a 168-register setmaxnreg region, and an m64n256 wgmma holds 128 accumulators at once
HALF = gl.constexpr(128)


@gluon.jit
def _value_step(sm: LatentSmem, o0, o1, i, STAGE: gl.constexpr, WG: gl.constexpr, COLS: gl.constexpr):
    """_values_split's tile i (in stage STAGE): O = O x alpha + P V for the two halves, then the stage back to the
    scores warpgroup."""
    rows_layout: gl.constexpr = gl.SliceLayout(1, wgmma_layout(HALF))
    dyn = i >> 30  # as in _scores
    v = sm.k.index(STAGE + dyn).reshape([BLOCK_N, LATENT_V])
    p = sm.k_tail.index(STAGE + dyn).reshape([HEADS, BLOCK_N])
    mbarrier.wait(sm.p_ready.index(STAGE), (i // 2) & 1)
    alpha = sm.alpha.slice(STAGE * HEADS, HEADS).load(rows_layout)
    o0 = warpgroup_mma(p, v.slice(WG * COLS, HALF, dim=1), o0 * alpha[:, None], is_async=True)
    o1 = warpgroup_mma(p, v.slice(WG * COLS + HALF, HALF, dim=1), o1 * alpha[:, None], is_async=True)
    o0, o1 = warpgroup_mma_wait(0, deps=[o0, o1])
    mbarrier.arrive(sm.kv_empty.index(STAGE), count=1)
    return o0, o1


@gluon.jit
def _store_half(o, l_i, empty, Out, stride_o, w: LatentWork, COL0):
    o = o / gl.where(empty, 1.0, l_i)[:, None]
    o_layout: gl.constexpr = wgmma_layout(HALF)
    stride_os, stride_ob, stride_om, stride_oh = stride_o
    heads = w.head0 + gl.arange(0, HEADS, layout=gl.SliceLayout(1, o_layout))
    cols = COL0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, o_layout))
    base = Out + gl.program_id(2).to(gl.int64) * stride_os + w.off_b.to(gl.int64) * stride_ob + w.q_pos.to(
        gl.int64) * stride_om
    gl.store(base + heads.to(gl.int64)[:, None] * stride_oh + cols[None, :], o.to(Out.dtype.element_ty))


@gluon.jit
def _values_split(WG: gl.constexpr, VALUE_WGS: gl.constexpr, sm: LatentSmem, w: LatentWork, Out, Lse, stride_o,
                  stride_lse, NUM_SPLITS: gl.constexpr):
    """_values for SCORE_WGS=2: P of tile i from stage i % 2's tail columns, its factor from alpha[i % 2], O in two
    [64, 128] halves; l from the two scores warpgroups' (m, l); value warpgroup 0 also writes lse."""
    COLS: gl.constexpr = LATENT_V // VALUE_WGS
    o_layout: gl.constexpr = wgmma_layout(HALF)
    rows_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    o0 = gl.zeros([HEADS, HALF], gl.float32, o_layout)
    o1 = gl.zeros([HEADS, HALF], gl.float32, o_layout)
    n_tiles = gl.cdiv(w.n_hi - w.n_lo, BLOCK_N)
    for i in range(0, n_tiles, 2):  # tile i in stage 0, i + 1 in stage 1 (static slices of alpha)
        o0, o1 = _value_step(sm, o0, o1, i, 0, WG, COLS)
        if i + 1 < n_tiles:
            o0, o1 = _value_step(sm, o0, o1, i + 1, 1, WG, COLS)
    mbarrier.wait(sm.done, 0)
    m0 = sm.stats.slice(0, HEADS).load(rows_layout)
    m1 = sm.stats.slice(HEADS, HEADS).load(rows_layout)
    m = gl.maximum(m0, m1)  # the last tile's running maximum
    m_use = gl.where(m == float("-inf"), 0.0, m)
    l0 = sm.stats.slice(2 * HEADS, HEADS).load(rows_layout)
    l_i = l0 * gl.exp2(m0 - m_use) + sm.stats.slice(3 * HEADS, HEADS).load(rows_layout) * gl.exp2(m1 - m_use)
    empty = l_i == 0.0
    _store_half(o0, l_i, empty, Out, stride_o, w, WG * COLS)
    _store_half(o1, l_i, empty, Out, stride_o, w, WG * COLS + HALF)
    if WG == 0:
        _store_lse(m, l_i, empty, Lse, stride_lse, w, NUM_SPLITS)


@gluon.jit
def _store_lse(m, l_i, empty, Lse, stride_lse, w: LatentWork, NUM_SPLITS: gl.constexpr):
    """The rows' lse from their final maxima and sums (rows in O halves' layout); rows that see no key as in
    _scores."""
    lse = (m + gl.log2(gl.where(empty, 1.0, l_i))) * 0.6931471805599453
    lse = gl.where(empty, float("-inf") if NUM_SPLITS > 1 else float("inf"), lse)
    stride_ls, stride_lb, stride_lm, stride_lh = stride_lse
    heads = w.head0 + gl.arange(0, HEADS, layout=gl.SliceLayout(1, wgmma_layout(HALF)))
    gl.store(Lse + gl.program_id(2).to(gl.int64) * stride_ls + w.off_b.to(gl.int64) * stride_lb
             + w.q_pos.to(gl.int64) * stride_lm + heads.to(gl.int64) * stride_lh, lse)


# SEESAW=1: per pair of key tiles (2j in stage 0, 2j + 1 in stage 1; P_a / P_b their P, m_a / m_b the running row
# maxima through each), with O of warpgroup W the columns [W x 256, + 256):
#   WG0: S_a, m_a, P_a; P_a into stage 0's tail, m_a into m_x[0], p_ready[0]; O = O x exp2(m - m_a) + P_a V_a
#        (P_a from registers); waits p_ready[1]; O = O x exp2(m_a - m_b) + P_b V_b (P_b from stage 1's tail).
#   WG1: S_b issued; waits p_ready[0]; O = O x exp2(m - m_a) + P_a V_a (P_a from stage 0's tail); S_b's m_b (over
#        m_a) and P_b into stage 1's tail, m_b into m_x[1], p_ready[1]; O = O x exp2(m_a - m_b) + P_b V_b.
# A P lives in its tile's stage, so a stage's kv_empty (both warpgroups' arrivals, each after its last wgmma reading
# the stage) also frees it. m_x[0] is rewritten only after WG0 has seen p_ready[1] of the pair, which WG1 arrives
# after reading m_x[0]; m_x[1] only after WG1 has seen the next p_ready[0], which WG0 arrives after reading m_x[1].
# p_ready[1] is arrived in every pair (in a last one of one tile without P), so both p_ready count phases by pair.


@gluon.jit
def _seesaw_loader(q_desc, k_desc, sm: LatentSmem, w: LatentWork, BlockTable, stride_bt, page_size, num_pages,
                   PAGED: gl.constexpr, PARTS: gl.constexpr, EARLY_FREE: gl.constexpr):
    """SEESAW's loader warp: Q once, then every key tile of the range as both consumers free its stage."""
    _load_q(q_desc, sm, w, True)
    for i in range(0, gl.cdiv(w.n_hi - w.n_lo, BLOCK_N)):
        _load_tile(k_desc, sm, w, i, BlockTable, stride_bt, page_size, num_pages, PAGED, PARTS, EARLY_FREE)


@gluon.jit
def _seesaw_p(s, m_prev, start_n, n_hi, qk_scale):
    """A tile's P against the running maxima m_prev: (P, the new maxima, O's and l's factor exp2(m_prev - m))."""
    s = _scaled(s, start_n, n_hi, qk_scale)
    m_new = gl.maximum(m_prev, gl.max(s, 1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    return gl.exp2(s - m_use[:, None]), m_new, gl.exp2(m_prev - m_use)


@gluon.jit
def _seesaw_pv(p, v, o0, o1, alpha, W: gl.constexpr):
    """O = O x alpha + P V over warpgroup W's 256 columns of the stage's V (two [64, 128] halves), issued."""
    a = gl.convert_layout(alpha, gl.SliceLayout(1, wgmma_layout(HALF)))[:, None]
    # both halves rescaled before either wgmma: O's registers written under an issued wgmma make ptxas wait for it
    o0 = o0 * a
    o1 = o1 * a
    o0 = warpgroup_mma(p, v.slice(W * 2 * HALF, HALF, dim=1), o0, is_async=True)
    o1 = warpgroup_mma(p, v.slice(W * 2 * HALF + HALF, HALF, dim=1), o1, is_async=True)
    return o0, o1


@gluon.jit
def _seesaw_settled(o):
    """A waited accumulator through a register move, at the end of each of WG1's branches: O's loop-carried
    registers written by a wgmma on either path made ptxas wait for every wgmma before the next pair's rescale of O
    (C7517, "warpgroup.wait is injected"), i.e. for S_b, issued just before."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [o], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _seesaw_publish(p, m_new, k, k_tail, sm: LatentSmem, start_n, n_hi, STAGE: gl.constexpr):
    """P (S is out: the stage's tail columns take it) and its maxima to the other warpgroup, the stage's rows past
    the sequence zeroed first (the last tile); P as the register operand of this warpgroup's own P V."""
    if start_n + BLOCK_N > n_hi:
        _zero_rows_from(k, n_hi - start_n)
    p = p.to(k_tail.dtype)
    k_tail.store(p)
    sm.m_x.slice(STAGE * HEADS, HEADS).store(m_new)
    fence_async_shared()
    mbarrier.arrive(sm.p_ready.index(STAGE), count=1)
    return gl.convert_layout(p, p_layout(HALF))


@gluon.jit
def _seesaw_take(sm: LatentSmem, o0, o1, m_i, l_i, j, dyn, STAGE: gl.constexpr, W: gl.constexpr,
                 PARTS: gl.constexpr, EARLY_FREE: gl.constexpr):
    """The other warpgroup's P of the pair's tile in STAGE (pair j): its maxima, O's and l's rescale, P V issued.
    Returns (o0, o1, the maxima, l)."""
    rows_layout: gl.constexpr = gl.SliceLayout(1, wgmma_layout(BLOCK_N))
    mbarrier.wait(sm.p_ready.index(STAGE), j & 1)
    for part in gl.static_range(PARTS):  # seen through p_ready already; stated for the async proxy
        # but with EARLY_FREE not WG1 on stage 0's first half: WG0 frees it alone, so the next tile's first half
        # may have landed by now (its barrier two phases on: a wait for this pair's parity would never return)
        if not (EARLY_FREE and W == 1 and _first_chunk(part, PARTS) < HALF_CHUNKS):
            mbarrier.wait(sm.kv_ready.index(STAGE * PARTS + part), j & 1)
    m_new = sm.m_x.slice(STAGE * HEADS, HEADS).load(rows_layout)
    alpha = gl.exp2(m_i - gl.where(m_new == float("-inf"), 0.0, m_new))
    v = sm.k.index(STAGE + dyn).reshape([BLOCK_N, LATENT_V])
    p = sm.k_tail.index(STAGE + dyn).reshape([HEADS, BLOCK_N])
    o0, o1 = _seesaw_pv(p, v, o0, o1, alpha, W)
    return o0, o1, m_new, l_i * alpha


@gluon.jit
def _seesaw_start(sm: LatentSmem, w: LatentWork):
    """A consumer's state before its first pair: (running maxima, sums, O's two halves, failed page reads, the
    range's tiles), once Q is in."""
    rows_layout: gl.constexpr = gl.SliceLayout(1, wgmma_layout(BLOCK_N))
    m_i = gl.full([HEADS], float("-inf"), gl.float32, rows_layout)
    l_i = gl.zeros([HEADS], gl.float32, rows_layout)
    o0 = gl.zeros([HEADS, HALF], gl.float32, wgmma_layout(HALF))
    o1 = gl.zeros([HEADS, HALF], gl.float32, wgmma_layout(HALF))
    mbarrier.wait(sm.q_bar, 0)
    return m_i, l_i, o0, o1, w.bits * 0, gl.cdiv(w.n_hi - w.n_lo, BLOCK_N)


@gluon.jit
def _seesaw_s(sm: LatentSmem, w: LatentWork, j, dyn, start_n, bad_page, BlockTable, stride_bt, page_size, num_pages,
              STAGE: gl.constexpr, PAGED: gl.constexpr, PARTS: gl.constexpr):
    """S of pair j's tile in STAGE issued as it lands, each part's columns once its barrier says so (dyn: the loop's
    runtime zero for the descriptors), and its page's check: (S in flight, the tile's two buffers, the failed page
    reads)."""
    q = sm.q.index(dyn).reshape([HEADS, LATENT_V])
    q_tail = sm.q_tail.index(dyn).reshape([HEADS, CHUNK])
    k = sm.k.index(STAGE + dyn).reshape([BLOCK_N, LATENT_V])
    k_tail = sm.k_tail.index(STAGE + dyn).reshape([BLOCK_N, CHUNK])
    if PARTS == 1:
        mbarrier.wait(sm.kv_ready.index(STAGE), j & 1)
        s = _issue_s(q, q_tail, k, k_tail)
    else:
        MAIN: gl.constexpr = LATENT_V // CHUNK
        s = gl.zeros([HEADS, BLOCK_N], gl.float32, wgmma_layout(BLOCK_N))
        for part in gl.static_range(PARTS):
            mbarrier.wait(sm.kv_ready.index(STAGE * PARTS + part), j & 1)
            for c in gl.static_range(_first_chunk(part, PARTS), _first_chunk(part + 1, PARTS)):
                if c < MAIN:
                    k_c = k.slice(c * CHUNK, CHUNK, dim=1).permute([1, 0])
                    s = warpgroup_mma(q.slice(c * CHUNK, CHUNK, dim=1), k_c, s, use_acc=c > 0, is_async=True)
                else:
                    s = warpgroup_mma(q_tail, k_tail.permute([1, 0]), s, is_async=True)
    _, _, bad = _page(BlockTable, stride_bt, w.kv_row, start_n, page_size, num_pages, PAGED)
    return s, k, k_tail, bad_page | bad.to(gl.int32)


@gluon.jit
def _seesaw_free(sm: LatentSmem, STAGE: gl.constexpr, W: gl.constexpr, EARLY_FREE: gl.constexpr):
    """Warpgroup W done with the stage's tile (its last wgmma on it waited). With EARLY_FREE, the halves it reads
    last: stage 0's first half is WG0's alone, its second (O's columns 256-511 and P_a) WG1's; stage 1's first half
    WG0's (after P_b V, which reads P_b from the second), its second both's."""
    if not EARLY_FREE:
        mbarrier.arrive(sm.kv_empty.index(STAGE), count=1)
    elif STAGE == 0:
        mbarrier.arrive(sm.kv_empty.index(W), count=1)
    else:
        if W == 0:
            mbarrier.arrive(sm.kv_empty.index(2), count=1)
        mbarrier.arrive(sm.kv_empty.index(3), count=1)


@gluon.jit
def _seesaw_first(q_desc, sm: LatentSmem, w: LatentWork, Out, Lse, Flag, BlockTable, stride_o, stride_lse,
                  stride_bt, qk_scale, page_size, num_pages, FLAG_WORD: gl.constexpr, NUM_SPLITS: gl.constexpr,
                  PAGED: gl.constexpr, PARTS: gl.constexpr, EARLY_FREE: gl.constexpr):
    """SEESAW's WG0: S and P of each pair's first tile (stage 0), both tiles' P V into O's columns [0, 256)."""
    m_i, l_i, o0, o1, bad_page, n_tiles = _seesaw_start(sm, w)
    for i in range(0, n_tiles, 2):
        j = i // 2
        start_n = w.n_lo + i * BLOCK_N
        dyn = i >> 30  # as in _scores_split, Q's descriptors too
        s, k, k_tail, bad_page = _seesaw_s(sm, w, j, dyn, start_n, bad_page, BlockTable, stride_bt, page_size,
                                           num_pages, 0, PAGED, PARTS)
        s = warpgroup_mma_wait(0, deps=[s])
        p, m_i, alpha = _seesaw_p(s, m_i, start_n, w.n_hi, qk_scale)
        l_i = l_i * alpha + gl.sum(p, 1)
        p = _seesaw_publish(p, m_i, k, k_tail, sm, start_n, w.n_hi, 0)
        o0, o1 = _seesaw_pv(p, k, o0, o1, alpha, 0)
        # P_a V runs while WG1 makes P_b; stage 0 goes back first (the loader's next tile), then P_b is awaited in
        # every pair (p_ready[1] comes in a last pair of one tile too: an in-flight wgmma cannot cross an if)
        o0, o1 = warpgroup_mma_wait(0, deps=[o0, o1])
        _seesaw_free(sm, 0, 0, EARLY_FREE)
        mbarrier.wait(sm.p_ready.index(1), j & 1)
        if i + 1 < n_tiles:
            o0, o1, m_i, l_i = _seesaw_take(sm, o0, o1, m_i, l_i, j, dyn, 1, 0, PARTS, EARLY_FREE)
            o0, o1 = warpgroup_mma_wait(0, deps=[o0, o1])
            _seesaw_free(sm, 1, 0, EARLY_FREE)
    _seesaw_finish(0, o0, o1, m_i, l_i, bad_page, sm, w, Out, Lse, Flag, stride_o, stride_lse, FLAG_WORD,
                   NUM_SPLITS)


@gluon.jit
def _seesaw_second(q_desc, sm: LatentSmem, w: LatentWork, Out, Lse, Flag, BlockTable, stride_o, stride_lse,
                   stride_bt, qk_scale, page_size, num_pages, FLAG_WORD: gl.constexpr, NUM_SPLITS: gl.constexpr,
                   PAGED: gl.constexpr, PARTS: gl.constexpr, EARLY_FREE: gl.constexpr):
    """SEESAW's WG1: S and P of each pair's second tile (stage 1), both tiles' P V into O's columns [256, 512)."""
    m_i, l_i, o0, o1, bad_page, n_tiles = _seesaw_start(sm, w)
    for i in range(0, n_tiles, 2):
        j = i // 2
        dyn = i >> 30
        if i + 1 < n_tiles:
            start_n = w.n_lo + (i + 1) * BLOCK_N
            s, k, k_tail, bad_page = _seesaw_s(sm, w, j, dyn, start_n, bad_page, BlockTable, stride_bt, page_size,
                                               num_pages, 1, PAGED, PARTS)
            # P_a V under S_b: S_b's two wgmma groups were committed first
            o0, o1, m_a, l_i = _seesaw_take(sm, o0, o1, m_i, l_i, j, dyn, 0, 1, PARTS, EARLY_FREE)
            s = warpgroup_mma_wait(2, deps=[s])
            p, m_i, beta = _seesaw_p(s, m_a, start_n, w.n_hi, qk_scale)
            l_i = l_i * beta + gl.sum(p, 1)
            p = _seesaw_publish(p, m_i, k, k_tail, sm, start_n, w.n_hi, 1)
            o0, o1 = warpgroup_mma_wait(0, deps=[o0, o1])
            _seesaw_free(sm, 0, 1, EARLY_FREE)
            o0, o1 = _seesaw_pv(p, k, o0, o1, beta, 1)
            o0, o1 = warpgroup_mma_wait(0, deps=[o0, o1])
            _seesaw_free(sm, 1, 1, EARLY_FREE)
            o0 = _seesaw_settled(o0)
            o1 = _seesaw_settled(o1)
        else:  # a last pair of one tile: p_ready[1] without P or maxima (WG0 reads neither)
            o0, o1, m_i, l_i = _seesaw_take(sm, o0, o1, m_i, l_i, j, dyn, 0, 1, PARTS, EARLY_FREE)
            mbarrier.arrive(sm.p_ready.index(1), count=1)
            o0, o1 = warpgroup_mma_wait(0, deps=[o0, o1])
            _seesaw_free(sm, 0, 1, EARLY_FREE)
            o0 = _seesaw_settled(o0)
            o1 = _seesaw_settled(o1)
    _seesaw_finish(1, o0, o1, m_i, l_i, bad_page, sm, w, Out, Lse, Flag, stride_o, stride_lse, FLAG_WORD,
                   NUM_SPLITS)


@gluon.jit
def _seesaw_finish(W: gl.constexpr, o0, o1, m_i, l_i, bad_page, sm: LatentSmem, w: LatentWork, Out, Lse, Flag,
                   stride_o, stride_lse, FLAG_WORD: gl.constexpr, NUM_SPLITS: gl.constexpr):
    """Both warpgroups end at the same maxima; l is the sum of their partial sums (each its own tiles' P), handed
    over through stats (NaN for a sequence that failed a check); O / l out, WG0 also lse."""
    rows_layout: gl.constexpr = gl.SliceLayout(1, wgmma_layout(HALF))
    failed = (w.bits | (bad_page << 4)) != 0
    if failed:
        gl.atomic_or(Flag + FLAG_WORD, w.bits | (bad_page << 4))  # both warpgroups may report
        l_i = gl.full(l_i.shape, float("nan"), gl.float32, l_i.type.layout)
    sm.stats.slice(W * HEADS, HEADS).store(l_i)
    fence_async_shared()
    mbarrier.arrive(sm.done, count=1)
    mbarrier.wait(sm.done, 0)
    l_i = sm.stats.slice(0, HEADS).load(rows_layout) + sm.stats.slice(HEADS, HEADS).load(rows_layout)
    empty = l_i == 0.0
    _store_half(o0, l_i, empty, Out, stride_o, w, W * 2 * HALF)
    _store_half(o1, l_i, empty, Out, stride_o, w, W * 2 * HALF + HALF)
    if W == 0:
        _store_lse(gl.convert_layout(m_i, rows_layout), l_i, empty, Lse, stride_lse, w, NUM_SPLITS)


@gluon.jit
def latent_decode_kernel(
    q_desc, k_desc, Out, Lse, Flag, CacheSeqlens, CacheBatchIdx, BlockTable, stride_o, stride_lse, stride_bt,
    nheads, seqlen_q, capacity, cache_rows, num_pages, page_size, qk_scale,
    NUM_SPLITS: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SEQLENS: gl.constexpr, HAS_BATCH_IDX: gl.constexpr,
    PAGED: gl.constexpr, FLAG_WORD: gl.constexpr, VALUE_WGS: gl.constexpr, EARLY_LOAD: gl.constexpr,
    SCORE_WGS: gl.constexpr = 1, SEESAW: gl.constexpr = 0, READY_PARTS: gl.constexpr = 1,
    EARLY_FREE: gl.constexpr = 0,
):
    """Program (query position, batch x 64-head slot, split). q_desc: (batch, seqlen_q, heads, 576) in [1, 1, 64, 64]
    boxes; k_desc: the cache (rows, capacity, 1, 576) or pages (num_pages, page_size, 1, 576) in [1, 64, 1, 64]
    boxes. Out / Lse as kvcache_attention_kernel's with NUM_SPLITS (fp32 partials past 1); qk_scale: log2 units."""
    w = _work(CacheSeqlens, CacheBatchIdx, nheads, seqlen_q, capacity, cache_rows, NUM_SPLITS, HAS_RIGHT,
              HAS_SEQLENS, HAS_BATCH_IDX)
    dtype: gl.constexpr = q_desc.dtype
    # with SCORE_WGS=2 or SEESAW, Q with a leading dim of 1 that the loop indexes by a runtime zero (_scores_split)
    q_lead: gl.constexpr = [1] if SCORE_WGS == 2 or SEESAW else []
    q_smem = gl.allocate_shared_memory(dtype, q_lead + [1, 1, HEADS, LATENT_V], q_desc.layout)
    q_tail = gl.allocate_shared_memory(dtype, q_lead + [1, 1, HEADS, CHUNK], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, 1, LATENT_V], k_desc.layout)
    k_tail = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, 1, CHUNK], k_desc.layout)
    rows: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    if SEESAW:
        # P in the stages' tail columns; m_x the pair's two running maxima, stats the two partial sums; p_ready by
        # stage (its tile's P and maxima out), kv_empty both consumers', done both sums out
        stats = gl.allocate_shared_memory(gl.float32, [2 * HEADS], rows)
        m_x = gl.allocate_shared_memory(gl.float32, [2 * HEADS], rows)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES * READY_PARTS, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES * (1 + EARLY_FREE), 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(kv_ready.index(s), count=1)
            if not EARLY_FREE:
                mbarrier.init(kv_empty.index(s), count=2)
            mbarrier.init(p_ready.index(s), count=1)
        for s in gl.static_range(STAGES, STAGES * READY_PARTS):  # a stage's parts past the first (READY_PARTS)
            mbarrier.init(kv_ready.index(s), count=1)
        if EARLY_FREE:  # by stage and half, one reader each but the last stage's second half (both; _seesaw_free)
            for s in gl.static_range(2 * STAGES - 1):
                mbarrier.init(kv_empty.index(s), count=1)
            mbarrier.init(kv_empty.index(2 * STAGES - 1), count=2)
        mbarrier.init(done, count=2)
        fence_async_shared()  # the inits visible to the async proxy (TMA's complete-tx), as CUDA's TMA guide fences
        # alpha, p_free, m_bar: unused
        sm = LatentSmem(q_smem, q_tail, k_smem, k_tail, k_tail, m_x, stats, q_bar, kv_ready, kv_empty, p_ready,
                        done, done, m_x, p_ready)
    elif SCORE_WGS == 2:
        # P in the stages' tail columns; alpha and p_ready by stage; each scores warpgroup's (m, l) and the maxima
        # they hand over; flat row buffers: slot j at [j x HEADS, + HEADS)
        alpha = gl.allocate_shared_memory(gl.float32, [STAGES * HEADS], rows)
        stats = gl.allocate_shared_memory(gl.float32, [4 * HEADS], rows)
        m_x = gl.allocate_shared_memory(gl.float32, [2 * HEADS], rows)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        m_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(kv_ready.index(s), count=1)
            mbarrier.init(kv_empty.index(s), count=VALUE_WGS)
            mbarrier.init(p_ready.index(s), count=1)
        for s in gl.static_range(2):
            mbarrier.init(m_bar.index(s), count=1)
        mbarrier.init(done, count=2)
        fence_async_shared()  # the inits visible to the async proxy (TMA's complete-tx), as CUDA's TMA guide fences
        sm = LatentSmem(q_smem, q_tail, k_smem, k_tail, k_tail, alpha, stats, q_bar, kv_ready, kv_empty, p_ready,
                        done, done, m_x, m_bar)
    else:
        p_smem = gl.allocate_shared_memory(dtype, [HEADS, BLOCK_N],
                                           gl.NVMMASharedLayout.get_default_for([HEADS, BLOCK_N], dtype))
        alpha = gl.allocate_shared_memory(gl.float32, [HEADS], rows)
        stats = gl.allocate_shared_memory(gl.float32, [HEADS], rows)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(kv_ready.index(s), count=1)
            mbarrier.init(kv_empty.index(s), count=VALUE_WGS)
        mbarrier.init(p_ready, count=1)
        mbarrier.init(p_free, count=VALUE_WGS)
        mbarrier.init(done, count=1)
        fence_async_shared()  # the inits visible to the async proxy (TMA's complete-tx), as CUDA's TMA guide fences
        # m_x / m_bar: unused with one scores warpgroup
        sm = LatentSmem(q_smem, q_tail, k_smem, k_tail, p_smem, alpha, stats, q_bar, kv_ready, kv_empty, p_ready,
                        p_free, done, alpha, done)
    # Gluon (3.6) takes the partition list only as a literal: one launch per value-warpgroup count
    if SEESAW:
        gl.warp_specialize([
            (_seesaw_first, (q_desc, sm, w, Out, Lse, Flag, BlockTable, stride_o, stride_lse, stride_bt, qk_scale,
                             page_size, num_pages, FLAG_WORD, NUM_SPLITS, PAGED, READY_PARTS, EARLY_FREE)),
            (_seesaw_second, (q_desc, sm, w, Out, Lse, Flag, BlockTable, stride_o, stride_lse, stride_bt, qk_scale,
                              page_size, num_pages, FLAG_WORD, NUM_SPLITS, PAGED, READY_PARTS, EARLY_FREE)),
            (_seesaw_loader, (q_desc, k_desc, sm, w, BlockTable, stride_bt, page_size, num_pages, PAGED,
                              READY_PARTS, EARLY_FREE)),
        ], [4, 1], [SEESAW_REGS, SEESAW_LOAD_REGS])
    elif SCORE_WGS == 2:
        gl.warp_specialize([
            (_scores_split, (0, q_desc, k_desc, sm, w, Flag, BlockTable, stride_bt, qk_scale, page_size, num_pages,
                             FLAG_WORD, PAGED)),
            (_scores_split, (1, q_desc, k_desc, sm, w, Flag, BlockTable, stride_bt, qk_scale, page_size, num_pages,
                             FLAG_WORD, PAGED)),
            (_values_split, (0, VALUE_WGS, sm, w, Out, Lse, stride_o, stride_lse, NUM_SPLITS)),
            (_values_split, (1, VALUE_WGS, sm, w, Out, Lse, stride_o, stride_lse, NUM_SPLITS)),
        ], [4, 4, 4], [SPLIT_SCORE_REGS, SPLIT_VALUE_REGS, SPLIT_VALUE_REGS])
    elif VALUE_WGS == 4:
        gl.warp_specialize([
            (_scores, (q_desc, k_desc, sm, w, Lse, Flag, BlockTable, stride_lse, stride_bt, qk_scale, page_size,
                       num_pages, FLAG_WORD, NUM_SPLITS, PAGED, EARLY_LOAD)),
            (_values, (0, VALUE_WGS, sm, w, Out, stride_o)),
            (_values, (1, VALUE_WGS, sm, w, Out, stride_o)),
            (_values, (2, VALUE_WGS, sm, w, Out, stride_o)),
            (_values, (3, VALUE_WGS, sm, w, Out, stride_o)),
        ], [4, 4, 4, 4], [96, 96, 96, 96])
    else:
        gl.warp_specialize([
            (_scores, (q_desc, k_desc, sm, w, Lse, Flag, BlockTable, stride_lse, stride_bt, qk_scale, page_size,
                       num_pages, FLAG_WORD, NUM_SPLITS, PAGED, EARLY_LOAD)),
            (_values, (0, VALUE_WGS, sm, w, Out, stride_o)),
            (_values, (1, VALUE_WGS, sm, w, Out, stride_o)),
        ], [4, 4], [168, 168])
    mbarrier.invalidate(q_bar)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(kv_ready.index(s))
        mbarrier.invalidate(kv_empty.index(s))
    if SEESAW:
        for s in gl.static_range(STAGES, STAGES * READY_PARTS):
            mbarrier.invalidate(kv_ready.index(s))
        for s in gl.static_range(STAGES, STAGES * (1 + EARLY_FREE)):
            mbarrier.invalidate(kv_empty.index(s))
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(p_ready.index(s))
    elif SCORE_WGS == 2:
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(p_ready.index(s))
        for s in gl.static_range(2):
            mbarrier.invalidate(m_bar.index(s))
    else:
        mbarrier.invalidate(p_ready)
        mbarrier.invalidate(p_free)
    mbarrier.invalidate(done)


def can_implement(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_new, cache_leftpad, block_table,
                  opts) -> str | None:
    """None when latent_decode_kernel runs this flash_attn_with_kvcache call, else why the Triton kernel does."""
    from ..portable.kvcache import v_is_k_view

    if k_cache.numel() == 0:  # an empty cache: the Triton kernel writes out 0 and lse +inf
        return "no keys (a descriptor needs a non-empty tensor)"
    if common.INTERPRET:
        return "the Triton interpreter cannot run Gluon"
    if not runs_sm90a(q):
        return "not an sm_90 (Hopper) GPU"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {q.dtype}"
    if q.shape[-1] != int(LATENT_QK) or v_cache.shape[-1] != int(LATENT_V) or not v_is_k_view(k_cache, v_cache):
        return "not MLA's latent cache (a 512-channel value cache viewing a 576-channel key cache)"
    if opts.varlen:
        return "packed queries (cu_seqlens_q)"
    if k_cache.shape[2] != 1 or q.shape[2] % int(HEADS):
        return f"{k_cache.shape[2]} kv heads, {q.shape[2]} query heads (the Gluon kernel: one, and a multiple of 64)"
    if k_new is not None or cache_leftpad is not None:
        return "appended keys or cache_leftpad"
    if block_table is not None and k_cache.shape[1] % int(BLOCK_N):
        return f"page size {k_cache.shape[1]} (the Gluon kernel reads whole 64-key tiles from a page)"
    if opts.window_left >= 0 or opts.window_right > 0:
        return "a sliding window"
    if opts.softcap > 0.0 or opts.alibi_slopes is not None or opts.learnable_sink is not None:
        return "softcap, ALiBi or a learnable sink"
    if not tma_usable(q, k_cache):
        return "a stride or base address that TMA cannot read (16-byte alignment, unit last stride)"
    return None


class LatentLaunch:
    """KVCachePlan's attend for the calls can_implement takes: the same call (tensors as kvcache_attention_kernel's
    launch gets them), o_strides / l_strides the plan's (split, batch, row, head) strides of Out and Lse."""

    def __init__(self, q: torch.Tensor, k_cache: torch.Tensor, block_table, cache_seqlens, cache_batch_idx, opts,
                 num_splits: int, o_strides: tuple, l_strides: tuple, flag_word: int) -> None:
        batch, seqlen_q, nheads, _ = q.shape
        paged = block_table is not None
        num_pages, page_size, capacity, cache_rows = cache_geometry(k_cache, block_table)
        self.tuning = tuning_for(capacity, num_splits)
        maxnreg, free_regs = launch_registers(self.tuning)
        self.q_block, self.k_block = [1, 1, int(HEADS), int(CHUNK)], [1, int(BLOCK_N), 1, int(CHUNK)]
        self.q_layout = shared_layout(self.q_block, q.dtype)
        self.k_layout = shared_layout(self.k_block, q.dtype)
        self.launch = Launch(
            latent_decode_kernel, (seqlen_q, batch * (nheads // int(HEADS)), num_splits), (),
            dict(stride_o=o_strides, stride_lse=l_strides, stride_bt=block_table.stride(0) if paged else 0,
                 nheads=nheads, seqlen_q=seqlen_q, capacity=capacity, cache_rows=cache_rows, num_pages=num_pages,
                 page_size=page_size, qk_scale=opts.kernel_args()["qk_scale"], NUM_SPLITS=num_splits,
                 HAS_RIGHT=opts.window_right >= 0, HAS_SEQLENS=cache_seqlens is not None,
                 HAS_BATCH_IDX=cache_batch_idx is not None, PAGED=paged, FLAG_WORD=flag_word, **self.tuning),
            num_warps=4, num_stages=1, options=dict(maxnreg=maxnreg),
            compiling=free_registers if free_regs else None)

    def __call__(self, q, k_cache, v_cache, out, lse, flag, cache_seqlens, cache_leftpad, cache_batch_idx,
                 block_table, *unused) -> None:
        self.launch(descriptor(q, self.q_block, self.q_layout), descriptor(k_cache, self.k_block, self.k_layout), out,
                    lse, flag, cache_seqlens, cache_batch_idx, block_table)


def compile_for_sm90(dtype: torch.dtype = torch.bfloat16, **flags):
    """Compile latent_decode_kernel for sm_90 without a GPU (CI's check; flags: its constexprs, False when left
    out, NUM_SPLITS 1)."""
    from .common import compile_gluon

    constants = dict(dict.fromkeys(("HAS_RIGHT", "HAS_SEQLENS", "HAS_BATCH_IDX", "PAGED"), False), NUM_SPLITS=1,
                     FLAG_WORD=0, **tuning_for(None))  # the defaults: one scores warpgroup
    constants.update(flags)
    out = "*fp32" if constants["NUM_SPLITS"] > 1 else "*DTYPE"
    types = dict(Out=out, Lse="*fp32", Flag="*i32", CacheSeqlens="*i32", CacheBatchIdx="*i32", BlockTable="*i32",
                 qk_scale="fp32", stride_o=("i32",) * 4, stride_lse=("i32",) * 4)
    for name in ("CacheSeqlens", "CacheBatchIdx", "BlockTable"):
        flag = {"CacheSeqlens": "HAS_SEQLENS", "CacheBatchIdx": "HAS_BATCH_IDX", "BlockTable": "PAGED"}[name]
        if not constants[flag]:
            constants[name] = None
    descriptors = dict(q_desc=[1, 1, int(HEADS), int(CHUNK)], k_desc=[1, int(BLOCK_N), 1, int(CHUNK)])
    return compile_gluon(latent_decode_kernel, dtype, int(LATENT_QK), descriptors, types, constants,
                         *launch_registers(constants))
