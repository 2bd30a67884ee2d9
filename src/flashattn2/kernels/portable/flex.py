"""FlexAttention's block masks on the portable kernels: the forward, dQ and dK/dV over a BlockMask's block lists.

A BlockMask (torch.nn.attention.flex_attention) lists, per (batch, head, query block), the key blocks a block of
queries sees: partial ones (kv_num_blocks / kv_indices), whose elements mask_mod decides, and full ones
(full_kv_num_blocks / full_kv_indices), seen whole. Key blocks in neither list are never visited. mask_mod is
evaluated on the host side once per partial block (partial_block_bits, on the GPU when the mask is there) into
one bit per (query, key); the kernels read those bits, so any mask_mod torch can run works here unchanged. dK/dV
walk the mask's transposed view (q_num_blocks / q_indices) with the same bits (transposed_partial_ids).
"""

import torch
import triton
import triton.language as tl

from .. import common
from ..common import INTERPRET, cdiv, load_rows, mma, padded_head_dim, round_to, store_rows
from ..device.block_list import partial_visible
from ..device.softmax import finalize, online_softmax_update
from .backward import bwd_preprocess_kernel

# mask_mod is evaluated on this many partial blocks at a time (bounds the host side's temporary memory)
EVAL_CHUNK = 256


@triton.jit
def _modded(qk, off_b, off_h, offs_m, offs_n, qk_scale, softmax_scale, captures, MOD_FN: tl.constexpr):
    """(the scores the softmax takes, their factor to log2 units): raw q.k and qk_scale, or with a score_mod (its
    @triton.jit function, score_mod.compile_score_mod) its value at q.k * scale, in log2 units already."""
    if MOD_FN is not None:
        s = MOD_FN(qk * softmax_scale, off_b, off_h, offs_m[:, None], offs_n[None, :], captures) * 1.4426950408889634
        scale = 1.0
    else:
        s = qk
        scale = qk_scale
    return s, scale


@triton.jit
def _visit_tile(Indices, Ids, t, SUBS: tl.constexpr, BLOCK: tl.constexpr, STEP: tl.constexpr,
                PARTIAL: tl.constexpr):
    """Tile t of a walk over a block list (SUBS tiles of STEP rows per BLOCK-row block): (its first row, its first
    row's place in its block, its block's row in the mask bits: 0 for full blocks)."""
    j = t // SUBS
    sub_start = (t % SUBS) * STEP
    block_id = 0
    if PARTIAL:
        block_id = tl.load(Ids + j)
    return tl.load(Indices + j) * BLOCK + sub_start, sub_start, block_id


@triton.jit
def _masked(x, fill, MaskBits, block_id, rows, cols, offs_m, offs_n, seqlen_q, seqlen_k, PARTIAL: tl.constexpr,
            EVEN: tl.constexpr, SPARSE_Q: tl.constexpr, SPARSE_KV: tl.constexpr):
    """A (queries x keys) tile x with `fill` where a PARTIAL block's bits (block_id; rows, cols: the tile's places
    in it) hide the pair or, unless EVEN (no tile crosses them), past the sequence ends."""
    if PARTIAL:
        visible = partial_visible(MaskBits, block_id, rows, cols, SPARSE_Q, SPARSE_KV)
        if not EVEN:
            visible = visible & (offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k)
        x = tl.where(visible, x, fill)
    elif not EVEN:
        x = tl.where((offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k), x, fill)
    return x


@triton.jit
def _flex_blocks(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, Num, Indices, Ids, MaskBits, offs_m, offs_d,
                 q_block_start, seqlen_q, seqlen_k, qk_scale, off_b, off_h, softmax_scale, captures,
                 MOD_FN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_N: tl.constexpr, SPARSE_Q: tl.constexpr, SPARSE_KV: tl.constexpr, PARTIAL: tl.constexpr,
                 EVEN_N: tl.constexpr, INTERPRET: tl.constexpr):
    """Fold the key blocks of one list (Num of them at Indices) into (acc, m_i, l_i); PARTIAL blocks apply their
    mask bits (Ids: each block's row in MaskBits). EVEN_N: seqlen_k is a multiple of SPARSE_KV, so no key tile
    crosses the end."""
    SUBS: tl.constexpr = SPARSE_KV // BLOCK_N
    offs_n0 = tl.arange(0, BLOCK_N)
    # one flat loop over (block, key tile of the block), so that the compiler pipelines the tiles' loads
    for t in range(tl.load(Num) * SUBS):
        start_n, sub_start, block_id = _visit_tile(Indices, Ids, t, SUBS, SPARSE_KV, BLOCK_N, PARTIAL)
        offs_n = start_n + offs_n0
        k = load_rows(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM,
                      BLOCK_D, not EVEN_N)
        qk, scale = _modded(mma(q, tl.trans(k), None, INTERPRET), off_b, off_h, offs_m, offs_n, qk_scale,
                            softmax_scale, captures, MOD_FN)
        qk = _masked(qk, float("-inf"), MaskBits, block_id, offs_m - q_block_start, sub_start + offs_n0, offs_m,
                     offs_n, seqlen_q, seqlen_k, PARTIAL, EVEN_N, SPARSE_Q, SPARSE_KV)
        p, alpha, m_i, l_i = online_softmax_update(qk, m_i, l_i, scale, True)
        v = load_rows(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM,
                      BLOCK_D, not EVEN_N)
        acc = mma(round_to(p, v.dtype, INTERPRET), v, acc * alpha[:, None], INTERPRET)
    return acc, m_i, l_i


@triton.jit
def _at(off_b, off_h, block, strides):
    """The offset of (batch, head, block) in a block list whose first three strides are `strides`."""
    return off_b * strides[0] + off_h * strides[1] + block * strides[2]


@triton.jit
def _query_tile(Q, K, V, stride_q, stride_k, stride_v, group, seqlen_q, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, SPARSE_Q: tl.constexpr):
    """This program's query tile (grid: query tiles, batch, heads): (batch, head, 64-bit batch, its mask block,
    rows, head-dim columns, the Q tile, its key head's K and V bases). Strides: (batch, head, row)."""
    start_m = tl.program_id(0) * BLOCK_M
    off_b = tl.program_id(1)
    off_h = tl.program_id(2)
    off_hk = (off_h // group).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    off_b64 = off_b.to(tl.int64)
    q = load_rows(Q + off_b64 * stride_q[0] + off_h.to(tl.int64) * stride_q[1] + offs_m[:, None] * stride_q[2]
                  + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D, True)
    k_base = K + off_b64 * stride_k[0] + off_hk * stride_k[1]
    v_base = V + off_b64 * stride_v[0] + off_hk * stride_v[1]
    return off_b, off_h, off_b64, start_m // SPARSE_Q, offs_m, offs_d, q, k_base, v_base


@triton.jit
def flex_fwd_kernel(
    Q, K, V, Out, Lse, KvNum, KvIndices, PartialIds, FullNum, FullIndices, MaskBits,
    stride_q, stride_k, stride_v, stride_o, stride_lse, stride_num, stride_idx, stride_full_num, stride_full_idx,
    group, seqlen_q, seqlen_k, qk_scale, softmax_scale, captures,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPARSE_Q: tl.constexpr, SPARSE_KV: tl.constexpr, HAS_FULL: tl.constexpr, EVEN_N: tl.constexpr,
    INTERPRET: tl.constexpr, MOD_FN: tl.constexpr = None,
):
    """One program per (query tile, batch x head): Out = softmax(Q K^T scale, masked by the block mask) V and Lse
    (natural log; -inf and Out 0 for rows that see no key, as FlexAttention gives). Q, K, V, Out are (batch,
    heads, seqlen, head_dim) with (batch, head, row) strides stride_q ... stride_o; stride_lse (batch, head). The
    block lists are (batch, head, query block[, j]) with stride 0 where the mask broadcasts. GQA: query head h
    reads key head h // group."""
    stride_ob, stride_oh, stride_om = stride_o
    off_b, off_h, off_b64, q_block, offs_m, offs_d, q, k_base, v_base = _query_tile(
        Q, K, V, stride_q, stride_k, stride_v, group, seqlen_q, HEAD_DIM, BLOCK_D, BLOCK_M, SPARSE_Q)
    stride_kn, stride_vn = stride_k[2], stride_v[2]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row = _at(off_b, off_h, q_block, stride_num)
    lists = _at(off_b, off_h, q_block, stride_idx)
    acc, m_i, l_i = _flex_blocks(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, KvNum + row,
                                 KvIndices + lists, PartialIds + lists, MaskBits, offs_m, offs_d, q_block * SPARSE_Q,
                                 seqlen_q, seqlen_k, qk_scale, off_b, off_h, softmax_scale, captures, MOD_FN, HEAD_DIM,
                                 BLOCK_D, BLOCK_N, SPARSE_Q, SPARSE_KV, True,
                                 EVEN_N, INTERPRET)
    if HAS_FULL:
        row = _at(off_b, off_h, q_block, stride_full_num)
        lists = _at(off_b, off_h, q_block, stride_full_idx)
        acc, m_i, l_i = _flex_blocks(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, FullNum + row,
                                     FullIndices + lists, FullIndices, MaskBits, offs_m, offs_d, q_block * SPARSE_Q,
                                     seqlen_q, seqlen_k, qk_scale, off_b, off_h, softmax_scale, captures, MOD_FN,
                                     HEAD_DIM, BLOCK_D, BLOCK_N, SPARSE_Q, SPARSE_KV, False, EVEN_N, INTERPRET)
    out, lse = finalize(acc, m_i, l_i)
    lse = tl.where(lse == float("inf"), float("-inf"), lse)  # FlexAttention's empty row
    store_rows(Out + off_b64 * stride_ob + off_h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_om
               + offs_d[None, :], round_to(out, Out.dtype.element_ty, INTERPRET), offs_m, seqlen_q, offs_d, HEAD_DIM,
               BLOCK_D)
    tl.store(Lse + off_b64 * stride_lse[0] + off_h.to(tl.int64) * stride_lse[1] + offs_m, lse, mask=offs_m < seqlen_q)


def _vmapped(mask_mod):
    """mask_mod over (block, query, key) grids: FlexAttention's mods are written for scalar indices."""
    fn = torch.vmap(mask_mod, in_dims=(None, None, None, 0))
    fn = torch.vmap(fn, in_dims=(None, None, 0, None))
    return torch.vmap(fn, in_dims=(0, 0, 0, 0))


def partial_block_bits(block_mask, seqlen_q: int, seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, bits): ids like block_mask.kv_indices, each partial block's row in bits; bits (partial blocks,
    query rows of a block, key columns / 32) int32, bit c of word w of row r set where mask_mod lets query r see
    key 32 w + c of the block. Indices past the sequence ends are clamped to the last row / key before mask_mod
    sees them (their scores are masked in the kernel anyway)."""
    sparse_q, sparse_kv = block_mask.BLOCK_SIZE
    num, indices = block_mask.kv_num_blocks, block_mask.kv_indices
    device = indices.device
    slots = torch.arange(indices.shape[-1], device=device)
    used = slots < num[..., None].long()  # (B, H, QB, max blocks): which list entries are real
    where = used.nonzero()
    ids = torch.zeros(indices.shape, dtype=torch.int32, device=device)
    ids[used] = torch.arange(where.shape[0], dtype=torch.int32, device=device)
    words = torch.empty(where.shape[0], sparse_q, sparse_kv // 32, dtype=torch.int32, device=device)
    fn = _vmapped(block_mask.mask_mod)
    rows, cols = torch.arange(sparse_q, device=device), torch.arange(sparse_kv, device=device)
    shifts = torch.arange(32, device=device, dtype=torch.int64)
    for lo in range(0, where.shape[0], EVAL_CHUNK):
        at = where[lo:lo + EVAL_CHUNK]
        b, h, qb = at[:, 0], at[:, 1], at[:, 2]
        kb = indices[b, h, qb, at[:, 3]].long()
        q_idx = (qb[:, None] * sparse_q + rows).clamp(max=max(seqlen_q - 1, 0))
        kv_idx = (kb[:, None] * sparse_kv + cols).clamp(max=max(seqlen_k - 1, 0))
        seen = fn(b, h, q_idx, kv_idx).to(torch.int64).view(len(at), sparse_q, sparse_kv // 32, 32)
        packed = (seen << shifts).sum(-1)  # 0 .. 2**32 - 1: wrapped into int32 below
        words[lo:lo + EVAL_CHUNK] = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)
    return ids, words


def _broadcast(x: torch.Tensor, batch: int, nheads: int) -> tuple[torch.Tensor, tuple]:
    """x (1 or batch, 1 or nheads, ...) and its first three strides, 0 where it broadcasts."""
    x = x.expand(batch, nheads, *x.shape[2:])
    return x, tuple(x.stride()[:3])


# (block_m, block_n, num_warps, num_stages) per kernel and padded head dim, first fit; Hopper-class GPUs and the
# rest alike for now. Tiles are clipped to the mask's blocks. OVERRIDE (kernel -> tuple) lets sweeps try others.
CONFIGS = {
    "fwd": [(64, (128, 64, 4, 3)), (128, (128, 64, 8, 3)), (256, (64, 64, 4, 2))],
    "dq": [(64, (64, 64, 4, 3)), (128, (64, 64, 4, 2)), (256, (64, 32, 4, 1))],
    "dkdv": [(64, (64, 64, 4, 3)), (128, (64, 64, 4, 2)), (256, (32, 64, 4, 1))],
}
OVERRIDE: dict[str, tuple[int, int, int, int]] = {}


def _config(kernel: str, block_mask, block_d: int) -> dict:
    """The launch keywords of one flex kernel: tiles (32 under the interpreter, within one mask block), warps and
    stages."""
    if INTERPRET:
        block_m, block_n, warps, stages = 32, 32, 4, 1
    else:
        block_m, block_n, warps, stages = OVERRIDE.get(kernel) or next(
            cfg for bound, cfg in CONFIGS[kernel] if block_d <= bound)
    sparse_q, sparse_kv = block_mask.BLOCK_SIZE
    return dict(BLOCK_M=min(block_m, sparse_q), BLOCK_N=min(block_n, sparse_kv), num_warps=warps,
                num_stages=stages)


def block_lists(block_mask, view: str, ids: torch.Tensor, batch: int, nheads: int,
                shared_strides: bool = False) -> tuple[tuple, dict]:
    """A view's ("kv": key blocks per query block; "q": the transposed one) block lists as the kernels take them:
    (counts, indices, partial ids, full counts, full indices) broadcast to (batch, nheads, ...), and their strides
    by name. Without full lists (separate_full_blocks=False) the partial ones stand in, unread by the portable
    kernels. shared_strides (the Gluon forward): the full lists share the partial ones' strides (copied where they
    do not), and a mask without full lists gets zero full counts."""
    num, s_num = _broadcast(getattr(block_mask, f"{view}_num_blocks"), batch, nheads)
    idx, s_idx = _broadcast(getattr(block_mask, f"{view}_indices").contiguous(), batch, nheads)
    ids, _ = _broadcast(ids, batch, nheads)
    full_num, s_full_num, full_idx, s_full_idx = num, s_num, idx, s_idx
    if block_mask.full_kv_num_blocks is not None:
        full_num, s_full_num = _broadcast(getattr(block_mask, f"full_{view}_num_blocks"), batch, nheads)
        full_idx, s_full_idx = _broadcast(getattr(block_mask, f"full_{view}_indices").contiguous(), batch, nheads)
    elif shared_strides:
        full_num = torch.zeros_like(num)
    if shared_strides and (s_full_num != s_num or s_full_idx != s_idx or ids.stride()[:3] != s_idx):
        num, full_num, idx, ids, full_idx = (x.contiguous() for x in (num, full_num, idx, ids, full_idx))
        s_num, s_idx = num.stride()[:3], idx.stride()[:3]
        s_full_num, s_full_idx = s_num, s_idx
    return ((num, idx, ids, full_num, full_idx),
            dict(stride_num=s_num, stride_idx=s_idx, stride_full_num=s_full_num, stride_full_idx=s_full_idx))


def flex_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, scale: float,
                 bits: tuple[torch.Tensor, torch.Tensor], mod=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of checked (batch, heads, seqlen, head_dim) inputs under block_mask; bits from
    partial_block_bits; mod: a score_mod.CompiledMod or None."""
    batch, nheads, seqlen_q, head_dim = q.shape
    seqlen_k = k.shape[2]
    sparse_q, sparse_kv = block_mask.BLOCK_SIZE
    out = common.empty(q.shape, q.dtype, q.device)
    lse = common.empty((batch, nheads, seqlen_q), torch.float32, q.device)
    if out.numel() == 0:
        lse.fill_(float("-inf"))
        return out, lse
    ids, words = bits
    tensors, lists = block_lists(block_mask, "kv", ids, batch, nheads)
    block_d = padded_head_dim(head_dim)
    cfg = _config("fwd", block_mask, block_d)
    grid = (cdiv(seqlen_q, cfg["BLOCK_M"]), batch, nheads)
    flex_fwd_kernel[grid](
        q, k, v, out, lse, *tensors, words if words.numel() else tensors[0],
        q.stride()[:3], k.stride()[:3], v.stride()[:3], out.stride()[:3], lse.stride()[:2], **lists,
        group=nheads // k.shape[1], seqlen_q=seqlen_q, seqlen_k=seqlen_k, qk_scale=scale * 1.4426950408889634,
        softmax_scale=scale, captures=None if mod is None else mod.captures,
        MOD_FN=None if mod is None else mod.fn, HEAD_DIM=head_dim, BLOCK_D=block_d, SPARSE_Q=sparse_q,
        SPARSE_KV=sparse_kv,
        HAS_FULL=block_mask.full_kv_num_blocks is not None, EVEN_N=seqlen_k % sparse_kv == 0, INTERPRET=INTERPRET,
        **cfg)
    return out, lse


@triton.jit
def _tile_probs(q, k, lse2, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, MaskBits, block_id, rows, cols, off_b,
                off_h, softmax_scale, captures, MOD_FN: tl.constexpr, MOD_GRAD: tl.constexpr,
                PARTIAL: tl.constexpr, EVEN: tl.constexpr, SPARSE_Q: tl.constexpr, SPARSE_KV: tl.constexpr,
                INTERPRET: tl.constexpr):
    """The probabilities P of one (queries x keys) tile from the forward's lse (log2 units; +inf for a row that
    sees no key, so that its P is 0), masked by the sequence ends (unless EVEN: no tile crosses them) and, in
    PARTIAL blocks, the mask bits of block_id (rows, cols: the tile's places in it); and the factor dS takes from
    a score_mod (its derivative in the score; 1 without one)."""
    qk = mma(q, tl.trans(k), None, INTERPRET)
    s, scale = _modded(qk, off_b, off_h, offs_m, offs_n, qk_scale, softmax_scale, captures, MOD_FN)
    p = tl.math.exp2(s * scale - lse2[:, None])
    grad = 1.0
    if MOD_GRAD is not None:
        grad = MOD_GRAD(qk * softmax_scale, off_b, off_h, offs_m[:, None], offs_n[None, :], captures)
    p = _masked(p, 0.0, MaskBits, block_id, rows, cols, offs_m, offs_n, seqlen_q, seqlen_k, PARTIAL, EVEN, SPARSE_Q,
                SPARSE_KV)
    return p, grad


@triton.jit
def _flex_dq_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, Num, Indices, Ids, MaskBits, offs_m,
                    offs_d, q_block_start, seqlen_q, seqlen_k, qk_scale, off_b, off_h, softmax_scale, captures,
                    MOD_FN: tl.constexpr, MOD_GRAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SPARSE_Q: tl.constexpr, SPARSE_KV: tl.constexpr,
                    PARTIAL: tl.constexpr, EVEN: tl.constexpr, INTERPRET: tl.constexpr):
    """dQ (unscaled: dS K) over the key blocks of one list, as _flex_blocks walks them."""
    SUBS: tl.constexpr = SPARSE_KV // BLOCK_N
    offs_n0 = tl.arange(0, BLOCK_N)
    for t in range(tl.load(Num) * SUBS):
        start_n, sub_start, block_id = _visit_tile(Indices, Ids, t, SUBS, SPARSE_KV, BLOCK_N, PARTIAL)
        offs_n = start_n + offs_n0
        k = load_rows(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM,
                      BLOCK_D, not EVEN)
        v = load_rows(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM,
                      BLOCK_D, not EVEN)
        p, grad = _tile_probs(q, k, lse2, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, MaskBits, block_id,
                              offs_m - q_block_start, sub_start + offs_n0, off_b, off_h, softmax_scale, captures,
                              MOD_FN, MOD_GRAD, PARTIAL, EVEN, SPARSE_Q, SPARSE_KV, INTERPRET)
        dp = mma(do, tl.trans(v), None, INTERPRET)
        ds = p * (dp - delta[:, None]) * grad
        dq = mma(round_to(ds, k.dtype, INTERPRET), k, dq, INTERPRET)
    return dq


@triton.jit
def flex_bwd_dq_kernel(
    Q, K, V, dOut, Lse, Delta, dQ, KvNum, KvIndices, PartialIds, FullNum, FullIndices, MaskBits,
    stride_q, stride_k, stride_v, stride_do, stride_dq, stride_lse, stride_num, stride_idx, stride_full_num,
    stride_full_idx, group, seqlen_q, seqlen_k, qk_scale, softmax_scale, captures,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPARSE_Q: tl.constexpr, SPARSE_KV: tl.constexpr, HAS_FULL: tl.constexpr, EVEN_N: tl.constexpr,
    INTERPRET: tl.constexpr, MOD_FN: tl.constexpr = None, MOD_GRAD: tl.constexpr = None,
):
    """dQ of one query tile: the forward's walk over the block lists, with P from the saved lse (natural log,
    -inf for empty rows) and Delta = rowsum(dO * O). Layouts as flex_fwd_kernel's; Delta like Lse."""
    off_b, off_h, off_b64, q_block, offs_m, offs_d, q, k_base, v_base = _query_tile(
        Q, K, V, stride_q, stride_k, stride_v, group, seqlen_q, HEAD_DIM, BLOCK_D, BLOCK_M, SPARSE_Q)
    stride_kn, stride_vn = stride_k[2], stride_v[2]
    do = load_rows(dOut + off_b64 * stride_do[0] + off_h.to(tl.int64) * stride_do[1] + offs_m[:, None] * stride_do[2]
                   + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D, True)
    row_stats = off_b64 * stride_lse[0] + off_h.to(tl.int64) * stride_lse[1] + offs_m
    lse = tl.load(Lse + row_stats, mask=offs_m < seqlen_q, other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    delta = tl.load(Delta + row_stats, mask=offs_m < seqlen_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row = _at(off_b, off_h, q_block, stride_num)
    lists = _at(off_b, off_h, q_block, stride_idx)
    dq = _flex_dq_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, KvNum + row, KvIndices + lists,
                         PartialIds + lists, MaskBits, offs_m, offs_d, q_block * SPARSE_Q, seqlen_q, seqlen_k,
                         qk_scale, off_b, off_h, softmax_scale, captures, MOD_FN, MOD_GRAD, HEAD_DIM, BLOCK_D,
                         BLOCK_N, SPARSE_Q, SPARSE_KV, True, EVEN_N, INTERPRET)
    if HAS_FULL:
        row = _at(off_b, off_h, q_block, stride_full_num)
        lists = _at(off_b, off_h, q_block, stride_full_idx)
        dq = _flex_dq_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, FullNum + row,
                             FullIndices + lists, FullIndices, MaskBits, offs_m, offs_d, q_block * SPARSE_Q, seqlen_q,
                             seqlen_k, qk_scale, off_b, off_h, softmax_scale, captures, MOD_FN, MOD_GRAD, HEAD_DIM,
                             BLOCK_D, BLOCK_N, SPARSE_Q, SPARSE_KV, False, EVEN_N, INTERPRET)
    store_rows(dQ + off_b64 * stride_dq[0] + off_h.to(tl.int64) * stride_dq[1] + offs_m[:, None] * stride_dq[2]
               + offs_d[None, :], round_to(dq * softmax_scale, dQ.dtype.element_ty, INTERPRET), offs_m, seqlen_q,
               offs_d, HEAD_DIM, BLOCK_D)


@triton.jit
def _flex_dkdv_blocks(dk, dv, k, v, Q, dOut, Lse, Delta, stride_qm, stride_dom, Num, Indices, Ids, MaskBits, offs_n,
                      offs_d, kv_block_start, seqlen_q, seqlen_k, qk_scale, off_b, off_h, softmax_scale, captures,
                      MOD_FN: tl.constexpr, MOD_GRAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, SPARSE_Q: tl.constexpr, SPARSE_KV: tl.constexpr,
                      PARTIAL: tl.constexpr, EVEN: tl.constexpr, INTERPRET: tl.constexpr):
    """dK (unscaled: dS^T Q) and dV (P^T dO) of one key tile over the query blocks of one list (the block
    mask's q_indices view); Q, dOut, Lse, Delta point at one query head's rows."""
    SUBS: tl.constexpr = SPARSE_Q // BLOCK_M
    offs_m0 = tl.arange(0, BLOCK_M)
    col = offs_n - kv_block_start  # the keys' places in their mask block
    for t in range(tl.load(Num) * SUBS):
        start_m, sub_start, block_id = _visit_tile(Indices, Ids, t, SUBS, SPARSE_Q, BLOCK_M, PARTIAL)
        offs_m = start_m + offs_m0
        # rows past the end read the last row instead of a masked load (their P is 0 below): triton 3.6 compiled
        # this loop with masked row loads into wrong dK on sm_90 (d128, 32-row tiles, 2 stages; NOTES, 2026-11-25)
        rows = offs_m if EVEN else tl.minimum(offs_m, seqlen_q - 1)
        q = load_rows(Q + rows[:, None] * stride_qm + offs_d[None, :], rows, seqlen_q, offs_d, HEAD_DIM, BLOCK_D,
                      False)
        do = load_rows(dOut + rows[:, None] * stride_dom + offs_d[None, :], rows, seqlen_q, offs_d, HEAD_DIM,
                       BLOCK_D, False)
        lse = tl.load(Lse + rows)
        delta = tl.load(Delta + rows)
        if not EVEN:
            lse = tl.where(offs_m < seqlen_q, lse, float("-inf"))
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        p, grad = _tile_probs(q, k, lse2, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, MaskBits, block_id,
                              sub_start + offs_m0, col, off_b, off_h, softmax_scale, captures, MOD_FN, MOD_GRAD,
                              PARTIAL, EVEN, SPARSE_Q, SPARSE_KV, INTERPRET)
        dv = mma(tl.trans(round_to(p, do.dtype, INTERPRET)), do, dv, INTERPRET)
        dp = mma(do, tl.trans(v), None, INTERPRET)
        ds = p * (dp - delta[:, None]) * grad
        dk = mma(tl.trans(round_to(ds, q.dtype, INTERPRET)), q, dk, INTERPRET)
    return dk, dv


@triton.jit
def flex_bwd_dkdv_kernel(
    Q, K, V, dOut, Lse, Delta, dK, dV, QNum, QIndices, QPartialIds, FullQNum, FullQIndices, MaskBits,
    stride_q, stride_k, stride_v, stride_do, stride_dk, stride_dv, stride_lse, stride_num, stride_idx,
    stride_full_num, stride_full_idx, group, seqlen_q, seqlen_k, qk_scale, softmax_scale, captures,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPARSE_Q: tl.constexpr, SPARSE_KV: tl.constexpr, HAS_FULL: tl.constexpr, EVEN_M: tl.constexpr,
    INTERPRET: tl.constexpr, MOD_FN: tl.constexpr = None, MOD_GRAD: tl.constexpr = None,
):
    """dK, dV of one key tile of one key head, summed over its group of query heads (GQA), over the query blocks
    that the block mask's q_indices view lists for the tile's key block (QPartialIds: each partial block's row in
    MaskBits). Layouts as flex_bwd_dq_kernel's; the block lists are (batch, query head, key block[, j])."""
    stride_kb, stride_kh, stride_kn = stride_k
    stride_vb, stride_vh, stride_vn = stride_v
    start_n = tl.program_id(0) * BLOCK_N
    off_b = tl.program_id(1)
    off_hk = tl.program_id(2)
    kv_block = start_n // SPARSE_KV
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    off_b64 = off_b.to(tl.int64)
    k = load_rows(K + off_b64 * stride_kb + off_hk.to(tl.int64) * stride_kh + offs_n[:, None] * stride_kn
                  + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM, BLOCK_D, True)
    v = load_rows(V + off_b64 * stride_vb + off_hk.to(tl.int64) * stride_vh + offs_n[:, None] * stride_vn
                  + offs_d[None, :], offs_n, seqlen_k, offs_d, HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for off_h in range(off_hk * group, off_hk * group + group):
        h64 = off_b64 * 0 + off_h  # int64 (the interpreter hands the loop an int)
        q_head = Q + off_b64 * stride_q[0] + h64 * stride_q[1]
        do_head = dOut + off_b64 * stride_do[0] + h64 * stride_do[1]
        stats = off_b64 * stride_lse[0] + h64 * stride_lse[1]
        row = _at(off_b, off_h, kv_block, stride_num)
        lists = _at(off_b, off_h, kv_block, stride_idx)
        dk, dv = _flex_dkdv_blocks(dk, dv, k, v, q_head, do_head, Lse + stats, Delta + stats, stride_q[2],
                                   stride_do[2], QNum + row, QIndices + lists, QPartialIds + lists, MaskBits, offs_n,
                                   offs_d, kv_block * SPARSE_KV, seqlen_q, seqlen_k, qk_scale, off_b, off_h,
                                   softmax_scale, captures, MOD_FN, MOD_GRAD, HEAD_DIM, BLOCK_D, BLOCK_M, SPARSE_Q,
                                   SPARSE_KV, True, EVEN_M, INTERPRET)
        if HAS_FULL:
            row = _at(off_b, off_h, kv_block, stride_full_num)
            lists = _at(off_b, off_h, kv_block, stride_full_idx)
            dk, dv = _flex_dkdv_blocks(dk, dv, k, v, q_head, do_head, Lse + stats, Delta + stats, stride_q[2],
                                       stride_do[2], FullQNum + row, FullQIndices + lists, FullQIndices, MaskBits,
                                       offs_n, offs_d, kv_block * SPARSE_KV, seqlen_q, seqlen_k, qk_scale, off_b,
                                       off_h, softmax_scale, captures, MOD_FN, MOD_GRAD, HEAD_DIM, BLOCK_D, BLOCK_M,
                                       SPARSE_Q, SPARSE_KV, False, EVEN_M, INTERPRET)
    store_rows(dK + off_b64 * stride_dk[0] + off_hk.to(tl.int64) * stride_dk[1] + offs_n[:, None] * stride_dk[2]
               + offs_d[None, :], round_to(dk * softmax_scale, dK.dtype.element_ty, INTERPRET), offs_n, seqlen_k,
               offs_d, HEAD_DIM, BLOCK_D)
    store_rows(dV + off_b64 * stride_dv[0] + off_hk.to(tl.int64) * stride_dv[1] + offs_n[:, None] * stride_dv[2]
               + offs_d[None, :], round_to(dv, dV.dtype.element_ty, INTERPRET), offs_n, seqlen_k, offs_d, HEAD_DIM,
               BLOCK_D)


def row_deltas(out: torch.Tensor, dout: torch.Tensor, dq_acc: torch.Tensor | None = None) -> torch.Tensor:
    """Delta = rowsum(dO * O) of (batch, heads, seqlen, head_dim) tensors, (batch, heads, seqlen) float32, by the
    dense backward's preprocess kernel (one pass, no fp32 copies); with dq_acc (fp32, like out) it also zeroes
    that."""
    batch, nheads, seqlen_q, head_dim = out.shape
    delta = common.empty((batch, nheads, seqlen_q), torch.float32, out.device)
    ot, dot = out.transpose(1, 2), dout.transpose(1, 2)
    dqt = ot if dq_acc is None else dq_acc.transpose(1, 2)
    block = 32 if INTERPRET else 64
    bwd_preprocess_kernel[(cdiv(seqlen_q, block), batch * nheads, 1)](
        ot, dot, delta, delta if dq_acc is None else dq_acc, None, Lse=None, Sink=None, DSink=None,
        stride_o=ot.stride()[:3], stride_do=dot.stride()[:3],
        stride_lse=delta.stride()[:2], stride_dq=dqt.stride()[:3], nheads=nheads, seqlen_q=seqlen_q, total_q=0,
        HEAD_DIM=head_dim, BLOCK_D=padded_head_dim(head_dim), BLOCK_M=block, IS_VARLEN=False,
        ZERO_DQ=dq_acc is not None, num_warps=4, num_stages=3)
    return delta


def transposed_partial_ids(block_mask, ids: torch.Tensor) -> torch.Tensor:
    """ids for the block mask's q_indices view: the MaskBits row of partial block (query block q_indices[..., j],
    key block kb), from the kv view's ids."""
    num, indices = block_mask.kv_num_blocks, block_mask.kv_indices
    n_q, n_kv = indices.shape[2], block_mask.q_indices.shape[2]
    table = torch.zeros(*indices.shape[:2], n_q, n_kv, dtype=torch.int32, device=indices.device)
    used = (torch.arange(indices.shape[-1], device=indices.device) < num[..., None].long()).nonzero().unbind(1)
    table[(*used[:3], indices[used].long())] = ids[used]
    # table[b, h, qb, kb]: the id of partial block (qb, kb); the q view lists query blocks per key block
    q_idx = block_mask.q_indices.long().clamp(max=n_q - 1)
    return table.transpose(2, 3).gather(3, q_idx.expand(*table.shape[:2], *q_idx.shape[2:])).contiguous()


def flex_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, block_mask, scale: float, bits: tuple[torch.Tensor, torch.Tensor],
                  q_ids: torch.Tensor, mod=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of flex_forward's (out, lse); q_ids from transposed_partial_ids; mod as flex_forward's."""
    batch, nheads, seqlen_q, head_dim = q.shape
    nheads_k, seqlen_k = k.shape[1], k.shape[2]
    dq = common.empty(q.shape, q.dtype, q.device)
    dk = common.empty(k.shape, k.dtype, k.device)
    dv = common.empty(v.shape, v.dtype, v.device)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    delta = row_deltas(out, dout)  # (batch, heads, seqlen_q), like lse
    ids, words = bits
    sparse_q, sparse_kv = block_mask.BLOCK_SIZE
    words = words if words.numel() else block_mask.kv_num_blocks
    block_d = padded_head_dim(head_dim)
    shared = dict(group=nheads // nheads_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k, qk_scale=scale * 1.4426950408889634,
                  softmax_scale=scale, captures=None if mod is None else mod.captures,
                  MOD_FN=None if mod is None else mod.fn, MOD_GRAD=None if mod is None else mod.grad,
                  HEAD_DIM=head_dim, BLOCK_D=block_d, SPARSE_Q=sparse_q, SPARSE_KV=sparse_kv,
                  HAS_FULL=block_mask.full_kv_num_blocks is not None, INTERPRET=INTERPRET)
    strides = dict(stride_q=q.stride()[:3], stride_k=k.stride()[:3], stride_v=v.stride()[:3],
                   stride_do=dout.stride()[:3], stride_lse=lse.stride()[:2])
    tensors, lists = block_lists(block_mask, "kv", ids, batch, nheads)
    cfg = _config("dq", block_mask, block_d)
    flex_bwd_dq_kernel[(cdiv(seqlen_q, cfg["BLOCK_M"]), batch, nheads)](
        q, k, v, dout, lse, delta, dq, *tensors, words, stride_dq=dq.stride()[:3], **strides, **lists, **shared,
        EVEN_N=seqlen_k % sparse_kv == 0, **cfg)
    tensors, lists = block_lists(block_mask, "q", q_ids, batch, nheads)
    cfg = _config("dkdv", block_mask, block_d)
    flex_bwd_dkdv_kernel[(cdiv(seqlen_k, cfg["BLOCK_N"]), batch, nheads_k)](
        q, k, v, dout, lse, delta, dk, dv, *tensors, words, stride_dk=dk.stride()[:3], stride_dv=dv.stride()[:3],
        **strides, **lists, **shared, EVEN_M=seqlen_q % sparse_q == 0, **cfg)
    return dq, dk, dv
