"""Attention over a KV cache (decoding, speculative decoding, chunked prefill): flash_attn_with_kvcache's
kernels, and the paged forward of flash_attn_varlen_func.

Per sequence i the keys are the cache positions [leftpad_i, cache_seqlens_i + seqlen_new), read through
paged_kv (dense rows or a block table of any page size); masks, score transforms and block ranges see
logical positions 0..seqlen_k_i - 1, exactly as in the training kernels.

- Split-KV: with NUM_SPLITS > 1 the key tiles of a program are cut into NUM_SPLITS contiguous ranges,
  each written as an fp32 partial output with its lse (-inf for an empty range) and merged by combine.py.
- Pack GQA: with few query rows, the query heads of a KV group share one tile (row r is query position
  r // G_PAD, head slot * G + r % G_PAD), so a decode tile is not mostly padding and K/V are read once
  per group.
- The values of cache_seqlens, cache_leftpad, cache_batch_idx and block_table are checked here, on the
  GPU: a sequence that fails a check reads and writes nothing, its outputs become NaN and the failed
  checks go to the flag word that cu_seqlens.raise_pending reads (no device-to-host sync).
"""

import torch
import triton
import triton.language as tl

from .. import common
from ..common import INTERPRET, LOG2E, cdiv, mma, padded_head_dim, round_to
from ..device.block_range import kv_range_for_q_tile
from ..device.mask import score_mask
from ..device.paged_kv import kv_row_coords, kv_row_ptrs, load_kv_rows, row_mask
from ..device.scores import fp8_scales, score_tail
from ..device.seqlen_info import query_bounds
from ..device.softmax import finalize, online_softmax_update
from ..launch import Launch, PlanCache, align
from ..params import AttnOptions
from . import cu_seqlens
from .combine import combine_launch
from .cu_seqlens import KVCACHE_WORD, raise_pending


@triton.jit
def cache_sequence(off_b, CacheSeqlens, CacheLeftpad, CacheBatchIdx, seqlen_new, capacity, cache_rows,
                   HAS_SEQLENS: tl.constexpr, HAS_LEFTPAD: tl.constexpr, HAS_BATCH_IDX: tl.constexpr):
    """(cache length before the append, leftpad, cache row, failed checks) of sequence off_b.

    The bits are those of cu_seqlens.KVCACHE_CHECKS; a sequence with any bit set gets length 0,
    leftpad 0 and row 0, so nothing it does can leave the tensors."""
    zero = off_b.to(tl.int64) * 0
    if HAS_SEQLENS:
        cache_len = tl.load(CacheSeqlens + off_b).to(tl.int64)
    else:
        cache_len = zero + (capacity - seqlen_new)
    if HAS_LEFTPAD:
        leftpad = tl.load(CacheLeftpad + off_b).to(tl.int64)
    else:
        leftpad = zero
    if HAS_BATCH_IDX:
        kv_row = tl.load(CacheBatchIdx + off_b).to(tl.int64)
    else:
        kv_row = zero + off_b
    bits = (cache_len < 0).to(tl.int32)
    bits |= (cache_len + seqlen_new > capacity).to(tl.int32) << 1
    bits |= ((leftpad < 0) | (leftpad > cache_len)).to(tl.int32) << 2
    bits |= ((kv_row < 0) | (kv_row >= cache_rows)).to(tl.int32) << 3
    failed = bits != 0
    return tl.where(failed, 0, cache_len), tl.where(failed, 0, leftpad), tl.where(failed, 0, kv_row), bits


@triton.jit(do_not_specialize=("total_q",))
def kvcache_attention_kernel(
    Q, KCache, VCache, Out, Lse, Flag, CacheSeqlens, CacheLeftpad, CacheBatchIdx, BlockTable, CuSeqlensQ,
    AlibiSlopes, QDescale, KDescale, VDescale, Sink,
    stride_q, stride_k, stride_v, stride_o, stride_lse, stride_bt, stride_alibi_b,
    nheads, group, seqlen_q, seqlen_new, capacity, cache_rows, num_pages, page_size, total_q,
    qk_scale, window_left, window_right, softcap_in2, softcap_out,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    G: tl.constexpr, G_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, HAS_LEFTPAD: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, PAGED: tl.constexpr,
    INTERPRET: tl.constexpr, IS_FP8: tl.constexpr = False, HEAD_DIM_V: tl.constexpr = 0,
    BLOCK_DV: tl.constexpr = 0, D_CHUNK: tl.constexpr = 0, D_TAIL: tl.constexpr = 0, V_IS_K: tl.constexpr = False,
):
    """One program per (row tile, batch x head slot, split). G query heads share a tile (G_PAD rows per
    query position, G of them used); G = 1 without packing. With NUM_SPLITS = 1, Out/Lse are the final
    outputs (lse +inf for a row that sees no key); otherwise fp32 partials (lse -inf when empty).
    IS_FP8: q and the caches are e4m3 with (batch, nheads_k) descales; they are widened to bf16 (exactly) and
    the matmuls run in bf16: decoding is bound by reading the cache, which FP8 halves.
    stride_q, _k, _v: (batch, row, head) strides; stride_o, stride_lse: (split, batch, row, head).
    HEAD_DIM_V / BLOCK_DV: V's and Out's head dim where it is smaller (MLA's latent cache; 0: HEAD_DIM). D_CHUNK: Q K^T
    over chunks of this many columns, Q re-read per key tile (query/key head dims past 256; 0: one product).
    D_TAIL (a value head dim smaller than the query's): Q K^T as Q[:, :DV] K[:, :DV]^T plus the tail's columns
    (D_TAIL: their padded width), so the first product's key tile is the value tile where V_IS_K (the value cache a
    view of the key cache's first channels: MLA's latent cache is then read once)."""
    DV: tl.constexpr = HEAD_DIM_V if HEAD_DIM_V > 0 else HEAD_DIM
    BDV: tl.constexpr = BLOCK_DV if BLOCK_DV > 0 else BLOCK_D
    stride_qb, stride_qm, stride_qh = stride_q
    stride_kb, stride_kn, stride_kh = stride_k
    stride_vb, stride_vn, stride_vh = stride_v
    stride_os, stride_ob, stride_om, stride_oh = stride_o
    stride_ls, stride_lb, stride_lm, stride_lh = stride_lse
    start_r = tl.program_id(0) * BLOCK_M
    pid_bh = tl.program_id(1)
    split = tl.program_id(2)
    n_slots = nheads // G
    off_b = pid_bh // n_slots
    slot = pid_bh % n_slots
    q_start, seqlen_q = query_bounds(off_b, CuSeqlensQ, seqlen_q, total_q, IS_VARLEN)
    start_q = start_r // G_PAD
    if start_q >= seqlen_q:
        return
    cache_len, leftpad, kv_row, bits = cache_sequence(off_b, CacheSeqlens, CacheLeftpad, CacheBatchIdx,
                                                      seqlen_new, capacity, cache_rows, HAS_SEQLENS, HAS_LEFTPAD,
                                                      HAS_BATCH_IDX)
    seqlen_k = tl.where(bits != 0, 0, cache_len + seqlen_new - leftpad).to(tl.int32)
    off_b64 = off_b.to(tl.int64)

    rows = start_r + tl.arange(0, BLOCK_M)
    q_pos = rows // G_PAD
    g = rows % G_PAD
    row_ok = (q_pos < seqlen_q) & (g < G)
    head = slot * G + tl.where(g < G, g, 0)
    off_hk = (slot * G) // group
    offs_d = tl.arange(0, BLOCK_D)
    q_rows = Q + off_b64 * stride_qb + (q_start + q_pos).to(tl.int64) * stride_qm + head.to(tl.int64) * stride_qh
    offs_dv = tl.arange(0, BDV)
    if D_TAIL > 0:
        offs_t = tl.arange(0, D_TAIL)
        q = tl.load(q_rows[:, None] + offs_dv[None, :], mask=row_mask(row_ok, offs_dv, DV, BDV), other=0.0)
        q_t = tl.load(q_rows[:, None] + DV + offs_t[None, :], mask=row_mask(row_ok, offs_t, HEAD_DIM - DV, D_TAIL),
                      other=0.0)
    elif D_CHUNK == 0:
        q = tl.load(q_rows[:, None] + offs_d[None, :], mask=row_mask(row_ok, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
    alibi_slope = 0.0
    if HAS_ALIBI:
        alibi_slope = (tl.load(AlibiSlopes + off_b64 * stride_alibi_b + head) * LOG2E)[:, None]
    v_descale = 1.0
    if IS_FP8:
        qk_scale, softcap_in2, v_descale = fp8_scales(QDescale, KDescale, VDescale, off_b, off_hk, nheads // group,
                                                      qk_scale, softcap_in2)
        q = q.to(tl.bfloat16)

    # (a name bound here must not be rebound to another type inside the loop: Triton carries it)
    n_lo, _full_lo, _full_hi, n_hi = kv_range_for_q_tile(start_q, seqlen_q, seqlen_k, window_left, window_right,
                                           BLOCK_M // G_PAD, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if NUM_SPLITS > 1:
        per_split = tl.cdiv(tl.cdiv(n_hi - n_lo, BLOCK_N), NUM_SPLITS) * BLOCK_N
        n_lo = n_lo + split * per_split
        n_hi = tl.minimum(n_hi, n_lo + per_split)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BDV], dtype=tl.float32)
    bad_page = tl.zeros([BLOCK_N], dtype=tl.int1)
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(n_lo, n_hi, BLOCK_N):
        offs_n = start_n + offs_n0
        valid = offs_n < seqlen_k
        outer, inner, bad = kv_row_coords(BlockTable, kv_row, leftpad + offs_n, valid, stride_bt, page_size,
                                          num_pages, PAGED)
        bad_page |= bad
        valid = valid & ~bad
        if D_TAIL > 0:
            kv = load_kv_rows(KCache, outer, inner, off_hk, stride_kb, stride_kn, stride_kh, offs_dv, valid, DV, BDV)
            k_t = load_kv_rows(KCache + DV, outer, inner, off_hk, stride_kb, stride_kn, stride_kh, offs_t, valid,
                               HEAD_DIM - DV, D_TAIL)
            qk = mma(q, tl.trans(kv), None, INTERPRET)
            qk = mma(q_t, tl.trans(k_t), qk, INTERPRET)
        elif D_CHUNK == 0:
            k = load_kv_rows(KCache, outer, inner, off_hk, stride_kb, stride_kn, stride_kh, offs_d, valid, HEAD_DIM,
                             BLOCK_D)
            if IS_FP8:
                k = k.to(tl.bfloat16)
            qk = mma(q, tl.trans(k), None, INTERPRET)
        else:
            qk = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for c in tl.static_range(HEAD_DIM // D_CHUNK):
                offs_c = c * D_CHUNK + tl.arange(0, D_CHUNK)
                q_c = tl.load(q_rows[:, None] + offs_c[None, :], mask=row_ok[:, None], other=0.0)
                k_c = load_kv_rows(KCache, outer, inner, off_hk, stride_kb, stride_kn, stride_kh, offs_c, valid,
                                   HEAD_DIM, D_CHUNK)
                qk = mma(q_c, tl.trans(k_c), qk, INTERPRET)
        # the mask below also drops keys on bad page entries (valid), so score_tail leaves masking to it
        qk, scale_log2, _tanh = score_tail(
            qk, q_pos[:, None], offs_n[None, :], seqlen_q, seqlen_k, qk_scale, window_left, window_right, softcap_in2,
            softcap_out, alibi_slope, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, False)
        visible = score_mask(q_pos[:, None], offs_n[None, :], seqlen_q, seqlen_k, window_left, window_right,
                             HAS_LEFT, HAS_RIGHT) & valid[None, :]
        qk = tl.where(visible, qk, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_update(qk, m_i, l_i, scale_log2, True)
        if V_IS_K:
            v = kv
        else:
            v = load_kv_rows(VCache, outer, inner, off_hk, stride_vb, stride_vn, stride_vh, offs_dv, valid, DV, BDV)
        if IS_FP8:
            v = v.to(tl.bfloat16)
        acc = mma(round_to(p, v.dtype, INTERPRET), v, acc * alpha[:, None], INTERPRET)

    bits |= tl.max(bad_page.to(tl.int32), 0) << 4
    if NUM_SPLITS > 1:
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    else:
        # learnable sinks (Sink) fold in here; split partials leave them to the merge (combine.py)
        out, lse = finalize(acc, m_i, l_i, 0.0, Sink, head)
    if IS_FP8:
        out = out * v_descale  # linear: split partials scale alike before the merge
    if bits != 0:
        tl.store(Flag + KVCACHE_WORD, bits)
        out = tl.full([BLOCK_M, BDV], float("nan"), tl.float32)
        lse = tl.full([BLOCK_M], float("nan"), tl.float32)
    row_off = off_b64 * stride_ob + (q_start + q_pos).to(tl.int64) * stride_om + head.to(tl.int64) * stride_oh
    o_rows = Out + split.to(tl.int64) * stride_os + row_off
    tl.store(o_rows[:, None] + offs_dv[None, :], round_to(out, Out.dtype.element_ty, INTERPRET),
             mask=row_mask(row_ok, offs_dv, DV, BDV))
    lse_off = off_b64 * stride_lb + (q_start + q_pos).to(tl.int64) * stride_lm + head.to(tl.int64) * stride_lh
    tl.store(Lse + split.to(tl.int64) * stride_ls + lse_off, lse, mask=row_ok)


@triton.jit
def kvcache_append_kernel(
    KNew, VNew, KCache, VCache, CacheSeqlens, CacheLeftpad, CacheBatchIdx, BlockTable,
    stride_k_new, stride_v_new, stride_k, stride_v, stride_bt, seqlen_new, capacity, cache_rows, num_pages, page_size,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, HAS_SEQLENS: tl.constexpr,
    HAS_LEFTPAD: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, PAGED: tl.constexpr,
):
    """Write new key/value rows j of sequence b at cache positions cache_seqlens[b] + j. A sequence that
    fails a check (the attention kernel reports it) writes nothing. Strides: (batch, row, head) each."""
    stride_knb, stride_knm, stride_knh = stride_k_new
    stride_vnb, stride_vnm, stride_vnh = stride_v_new
    stride_kb, stride_kn, stride_kh = stride_k
    stride_vb, stride_vn, stride_vh = stride_v
    start_m = tl.program_id(0) * BLOCK_M
    off_b = tl.program_id(1)
    off_hk = tl.program_id(2)
    cache_len, _, kv_row, bits = cache_sequence(off_b, CacheSeqlens, CacheLeftpad, CacheBatchIdx, seqlen_new,
                                                capacity, cache_rows, HAS_SEQLENS, HAS_LEFTPAD, HAS_BATCH_IDX)
    if bits == 0:
        rows = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        valid = rows < seqlen_new
        outer, inner, bad = kv_row_coords(BlockTable, kv_row, cache_len + rows, valid, stride_bt, page_size,
                                          num_pages, PAGED)
        mask = row_mask(valid & ~bad, offs_d, HEAD_DIM, BLOCK_D)
        off_b64 = off_b.to(tl.int64)
        src = rows[:, None].to(tl.int64)
        k = tl.load(KNew + off_b64 * stride_knb + src * stride_knm + off_hk * stride_knh + offs_d[None, :], mask=mask)
        v = tl.load(VNew + off_b64 * stride_vnb + src * stride_vnm + off_hk * stride_vnh + offs_d[None, :], mask=mask)
        tl.store(kv_row_ptrs(KCache, outer, inner, off_hk, stride_kb, stride_kn, stride_kh, offs_d), k, mask=mask)
        tl.store(kv_row_ptrs(VCache, outer, inner, off_hk, stride_vb, stride_vn, stride_vh, offs_d), v, mask=mask)


# the largest query tile of the KV-cache kernel
MAX_BLOCK_M = 16 if INTERPRET else 64
# the column chunks of Q K^T at query/key head dims past 256 (MLA's latent cache: 576 = 9 x 64)
LATENT_CHUNK = 64


def pack_group(seqlen_q: int, group: int) -> int:
    """Query heads sharing a tile: the whole GQA group when the query rows are few and a tile holds the
    group's (padded) heads of at least one query position; a group larger than a tile (MLA's 128 query heads on
    one latent head) in its largest divisor that fits, so the cache is read once per tile of heads, not per head."""
    g_pad = triton.next_power_of_2(group)
    if group <= 1 or seqlen_q * min(g_pad, MAX_BLOCK_M) > 128:
        return 1
    if g_pad <= MAX_BLOCK_M:
        return group
    return next(g for g in range(MAX_BLOCK_M, 0, -1)
                if group % g == 0 and seqlen_q * triton.next_power_of_2(g) <= 128
                and triton.next_power_of_2(g) <= MAX_BLOCK_M)


def cache_geometry(k_cache: torch.Tensor, block_table) -> tuple[int, int, int, int]:
    """(num_pages, page_size, capacity, cache_rows) of a dense cache (rows, capacity, ...) or of pages (num_pages,
    page_size, ...) with a block table (rows, pages per row): a dense cache is one page of one row."""
    if block_table is not None:
        num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
        return num_pages, page_size, block_table.shape[1] * page_size, block_table.shape[0]
    return 1, 1, k_cache.shape[1], k_cache.shape[0]


def v_is_k_view(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """The value cache is the key cache's first channels (one latent cache): same storage, start and row strides."""
    return (v_cache.data_ptr() == k_cache.data_ptr() and v_cache.stride()[:-1] == k_cache.stride()[:-1]
            and v_cache.shape[:-1] == k_cache.shape[:-1])


# (keys per tile, warps, stages) of the KV-cache kernel at a value head dim past 256 (MLA's latent cache, 512), by
# whether the value tile is the key tile. Measured on an H100 (576/512, 128 heads, bf16): 64 x 8 x 2 reads a
# latent cache 20-40% faster than 32-key tiles; a value cache of its own takes 32 keys (64 need 352 KB of shared
# memory), sm_90 ptxas: 255 registers, 0-120 bytes of stack
LATENT_TILES = {True: (64, 8, 2), False: (32, 8, 2)}


def kv_tiles(block_d: int, paged: bool) -> tuple[int, int]:
    """(keys per tile, pipeline stages). Dense: 64 keys, three stages. Paged: 128 keys, two stages, measured
    10-25% faster than 64 x 3 at page size 16 (scripts/kvcache_paged_sweep.py, H100): each tile's rows wait on
    its block-table entries, so fewer, larger tiles keep more bytes in flight."""
    if INTERPRET:
        return 16, 1
    if block_d > 128:
        return 64, 2  # K and V stages of 128 keys would not fit in shared memory
    return (128, 2) if paged else (64, 3)


# programs per SM that split-KV aims at, dense and paged: measured best on an H100 at batch 1-8
# (scripts/kvcache_splits.py, scripts/kvcache_paged_sweep.py)
PROGRAMS_PER_SM = {False: 1, True: 2}


def num_splits_heuristic(programs: int, capacity: int, block_n: int, device: torch.device,
                         paged: bool = False, one_per_sm: bool = False) -> int:
    """Splits of the keys from static shapes only (no sync: a decode step stays capturable): about
    PROGRAMS_PER_SM programs per SM, each with at least four key tiles. Measured on an H100: dense caches do
    best at one program per SM (10-25% ahead of two to four at batch 1), paged ones at two. one_per_sm: programs
    that fill an SM alone (the latent cache's): one wave of them, each with at least two key tiles."""
    if device.type != "cuda" or programs == 0:
        return 1
    n_sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    if one_per_sm:
        return max(1, min(n_sms // programs, cdiv(capacity, 2 * block_n), 128))
    target = PROGRAMS_PER_SM[paged] * n_sms
    if programs >= target:
        return 1
    return max(1, min(cdiv(target, programs), cdiv(capacity, 4 * block_n), 128))


_sm_counts: dict[int, int] = {}


def _sm_count(index: int) -> int:
    count = _sm_counts.get(index)
    if count is None:
        count = _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return count


class KVCachePlan:
    """The launches of one flash_attn_with_kvcache (or paged varlen) shape and option set.

    q is (batch, seqlen_q, heads, dim), or packed (total_q, heads, dim) with opts.cu_seqlens_q; the
    caches are (cache rows, capacity, heads_k, dim) or pages (num_pages, page_size, heads_k, dim) with
    a block table. hopper: backends.kvcache_hopper's maker of a Gluon attend for the call, or None (`backend` says
    which kernel attends)."""

    def __init__(self, q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_leftpad, cache_batch_idx, block_table,
                 opts: AttnOptions, num_splits: int, hopper=None) -> None:
        varlen = opts.varlen
        if varlen:
            batch, seqlen_q = opts.cu_seqlens_q.shape[0] - 1, opts.max_seqlen_q
            nheads, head_dim = q.shape[1], q.shape[2]
            q_strides = (0, q.stride(0), q.stride(1))
        else:
            batch, seqlen_q, nheads, head_dim = q.shape
            q_strides = tuple(q.stride()[:3])
        nheads_k = k_cache.shape[2]
        group = nheads // nheads_k
        paged = block_table is not None
        num_pages, page_size, capacity, cache_rows = cache_geometry(k_cache, block_table)
        seqlen_new = 0 if k_new is None else k_new.shape[1]
        block_d = padded_head_dim(head_dim)
        # MLA's latent cache: V (and out) narrower than Q and K; Q K^T over 64-column chunks past 256
        head_dim_v = v_cache.shape[-1]
        latent = dict(HEAD_DIM_V=head_dim_v, BLOCK_DV=padded_head_dim(head_dim_v)) if head_dim_v != head_dim else {}
        d_tail = max(16, triton.next_power_of_2(head_dim - head_dim_v)) if head_dim_v < head_dim else 0
        if 0 < d_tail <= 256:
            # Q K^T over V's columns plus the tail: the key tile of the first product is the value tile when the
            # value cache is a view of the key cache's first channels
            latent.update(D_TAIL=d_tail, V_IS_K=v_is_k_view(k_cache, v_cache))
        elif head_dim > 256:
            block_d = LATENT_CHUNK
            latent["D_CHUNK"] = LATENT_CHUNK
        g = pack_group(seqlen_q, group)
        g_pad = triton.next_power_of_2(g)
        rows = seqlen_q * g_pad
        block_m = max(16, min(triton.next_power_of_2(rows), MAX_BLOCK_M))
        block_n, num_stages = kv_tiles(max(block_d, latent.get("BLOCK_DV", 0)), paged)
        num_warps, one_per_sm = 4, False
        if latent.get("BLOCK_DV", 0) > 256 and not INTERPRET:
            # a (64 heads, 512) fp32 accumulator over 8 warps with Q's 576 columns in shared memory: one program
            # fills an SM
            block_n, num_warps, num_stages = LATENT_TILES[latent.get("V_IS_K", False)]
            one_per_sm = True
        m_tiles = cdiv(rows, block_m)
        programs = m_tiles * batch * (nheads // g)
        if num_splits <= 0:
            num_splits = num_splits_heuristic(programs, capacity, block_n, q.device, paged, one_per_sm)
        self.num_splits = num_splits = max(1, min(num_splits, 256))
        self.batch, self.seqlen_q, self.varlen = batch, seqlen_q, varlen
        fp8 = q.dtype == torch.float8_e4m3fn
        self.out_shape, self.dtype, self.device = (*q.shape[:-1], head_dim_v), torch.bfloat16 if fp8 else q.dtype, \
            q.device
        self.empty = batch * seqlen_q * nheads == 0
        total_q = q.shape[0] if varlen else batch * seqlen_q
        # final outputs: out like q, lse (batch, heads, seqlen_q) or packed (heads, total_q)
        self.lse_shape = (nheads, total_q) if varlen else (batch, nheads, seqlen_q)
        if num_splits > 1:
            # partials in combine.py's layout (splits, batch, seqlen, heads, dim); packed q is one batch entry
            pb, ps = (1, total_q) if varlen else (batch, seqlen_q)
            self.partial_shape = (num_splits, pb, ps, nheads, head_dim_v)
            sp = torch.empty(self.partial_shape, device="meta").stride()
            o_strides = (sp[0], 0 if varlen else sp[1], sp[2], sp[3])
            lse_p = torch.empty(self.partial_shape[:4], device="meta").stride()
            l_strides = (lse_p[0], 0 if varlen else lse_p[1], lse_p[2], lse_p[3])
        else:
            self.partial_shape = None
            so = torch.empty(self.out_shape, device="meta").stride()
            o_strides = (0, 0, so[0], so[1]) if varlen else (0, so[0], so[1], so[2])
            sl = torch.empty(self.lse_shape, device="meta").stride()
            l_strides = (0, 0, 1, sl[0]) if varlen else (0, sl[0], 1, sl[1])
        named = opts.kernel_args()
        stride_bt = block_table.stride(0) if paged else 0
        flags = dict(HAS_SEQLENS=cache_seqlens is not None, HAS_LEFTPAD=cache_leftpad is not None,
                     HAS_BATCH_IDX=cache_batch_idx is not None, PAGED=paged)
        self.attend = Launch(
            kvcache_attention_kernel, (m_tiles, batch * (nheads // g), num_splits), (),
            dict(named, stride_q=q_strides, stride_k=k_cache.stride()[:3], stride_v=v_cache.stride()[:3],
                 stride_o=o_strides, stride_lse=l_strides, stride_bt=stride_bt, nheads=nheads, group=group,
                 seqlen_q=seqlen_q, seqlen_new=seqlen_new, capacity=capacity, cache_rows=cache_rows,
                 num_pages=num_pages, page_size=page_size, total_q=total_q,
                 HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n, G=g, G_PAD=g_pad,
                 NUM_SPLITS=num_splits, INTERPRET=INTERPRET, IS_FP8=fp8, **flags, **latent),
            num_warps, num_stages)
        self.backend = "triton"
        if hopper is not None:
            attend = hopper(q, k_cache, v_cache, k_new, cache_seqlens, cache_leftpad, cache_batch_idx, block_table,
                            opts, num_splits, o_strides, l_strides)
            if attend is not None:
                self.attend, self.backend = attend, "gluon-sm90"
        self.combine = None
        if num_splits > 1:
            # combine writes (batch, seqlen, heads) views of our out and lse: out as is, or packed as one batch
            # entry; lse (batch, heads, seqlen) transposed, or packed (heads, total) as one batch entry
            so = torch.empty(self.out_shape, device="meta").stride()
            sl = torch.empty(self.lse_shape, device="meta").stride()
            out_v = (0, so[0], so[1]) if varlen else so[:3]
            lse_v = (0, 1, sl[0]) if varlen else (sl[0], sl[2], sl[1])
            # a row that sees no key gets the attention functions' +inf, not the merge's -inf
            self.combine = combine_launch(self.partial_shape, out_v, lse_v, empty_lse=float("inf"))
        self.append = None
        if seqlen_new > 0:
            block = 16
            self.append = Launch(
                kvcache_append_kernel, (cdiv(seqlen_new, block), batch, nheads_k), (),
                dict(stride_k_new=k_new.stride()[:3], stride_v_new=v_new.stride()[:3], stride_k=k_cache.stride()[:3],
                     stride_v=v_cache.stride()[:3], stride_bt=stride_bt, seqlen_new=seqlen_new, capacity=capacity,
                     cache_rows=cache_rows, num_pages=num_pages, page_size=page_size, HEAD_DIM=head_dim,
                     BLOCK_D=block_d, BLOCK_M=block, **flags), 4, 1)

    def __call__(self, q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_leftpad, cache_batch_idx, block_table,
                 opts: AttnOptions, flag: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 descales=(None, None, None)):
        """Append, then attend into out / lse (allocated by the caller). descales: FP8's (q, k, v) factors."""
        tables = (cache_seqlens, cache_leftpad, cache_batch_idx, block_table)
        if self.append is not None:
            self.append(k_new, v_new, k_cache, v_cache, *tables)
        if self.empty:
            return
        if self.num_splits == 1:
            self.attend(q, k_cache, v_cache, out, lse, flag, *tables, opts.cu_seqlens_q, opts.alibi_slopes, *descales,
                        opts.learnable_sink)
            return
        out_p = torch.empty(self.partial_shape, dtype=torch.float32, device=self.device)
        lse_p = torch.empty(self.partial_shape[:4], dtype=torch.float32, device=self.device)
        self.attend(q, k_cache, v_cache, out_p, lse_p, flag, *tables, opts.cu_seqlens_q, opts.alibi_slopes,
                    *descales, None)
        if self.combine is not None:
            self.combine(out_p, lse_p, out, lse, opts.learnable_sink)


_plans = PlanCache()


def _layout(x: torch.Tensor | None):
    return None if x is None else (x.shape, x.stride(), x.dtype, align(x))


def kvcache_plan(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_leftpad, cache_batch_idx, block_table,
                 opts: AttnOptions, num_splits: int, hopper=None) -> KVCachePlan:
    key = (q.device, *(_layout(x) for x in (q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_leftpad,
                                             cache_batch_idx, block_table)), opts.plan_key(), num_splits,
           v_cache.shape[-1] < k_cache.shape[-1] and v_is_k_view(k_cache, v_cache), getattr(hopper, "key", None))
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.add(key, KVCachePlan(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_leftpad,
                                           cache_batch_idx, block_table, opts, num_splits, hopper))
    return plan


def kvcache_attention(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_leftpad, cache_batch_idx, block_table,
                      opts: AttnOptions, num_splits: int, plan: KVCachePlan | None = None, descales=None, hopper=None):
    """Append (k_new, v_new already rotated), then attend, on checked inputs; returns (out, lse, plan).
    plan is kvcache_plan's for these inputs, where the caller has it already; descales: FP8's factors; hopper: as
    KVCachePlan's."""
    device = q.device
    raise_pending(device)  # a failed check of an earlier call
    if plan is None:
        plan = kvcache_plan(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_leftpad, cache_batch_idx,
                            block_table, opts, num_splits, hopper)
    out = common.empty(plan.out_shape, plan.dtype, device)
    lse = common.empty(plan.lse_shape, torch.float32, device)
    plan(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_leftpad, cache_batch_idx, block_table, opts,
         cu_seqlens.flag(device), out, lse, descales or (None, None, None))
    if cu_seqlens.SYNC_CHECKS and device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
        raise_pending(device)
    return out, lse, plan
