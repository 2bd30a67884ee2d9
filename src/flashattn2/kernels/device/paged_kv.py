"""Where a K/V row of a cache lives: the one place that knows about pages.

Masks, score transforms and block ranges work on logical key positions; only the address of a row
depends on the cache's layout:
- dense: cache[kv_row, pos] with kv_row the sequence's cache row (cache_batch_idx or the batch index);
- paged: cache[block_table[kv_row, pos // page_size], pos % page_size], any page size.
"""

import triton
import triton.language as tl


@triton.jit
def kv_row_coords(BlockTable, kv_row, pos, valid, stride_bt, page_size, num_pages, PAGED: tl.constexpr):
    """(outer, inner, bad) for cache positions pos: the row lives at outer * stride_batch_or_page +
    inner * stride_row. bad marks valid positions whose page index is outside [0, num_pages): they are
    redirected to page 0 (a safe address) and the caller reports them."""
    if PAGED:
        slot = pos // page_size
        page = tl.load(BlockTable + kv_row.to(tl.int64) * stride_bt + slot, mask=valid, other=0)
        bad = valid & ((page < 0) | (page >= num_pages))
        outer = tl.where(bad, 0, page).to(tl.int64)
        inner = (pos - slot * page_size).to(tl.int64)
    else:
        bad = pos < 0  # never true for checked positions; keeps one return signature
        outer = kv_row.to(tl.int64) + tl.zeros_like(pos).to(tl.int64)
        inner = pos.to(tl.int64)
    return outer, inner, bad


@triton.jit
def kv_row_ptrs(Cache, outer, inner, off_hk, stride_b, stride_n, stride_h, offs_d):
    """Pointers to the (rows, BLOCK_D) tile of cache rows at (outer, inner), head off_hk."""
    base = Cache + outer[:, None] * stride_b + inner[:, None] * stride_n + off_hk.to(tl.int64) * stride_h
    return base + offs_d[None, :]


@triton.jit
def row_mask(valid, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    mask = valid[:, None]
    if HEAD_DIM != BLOCK_D:
        mask = mask & (offs_d[None, :] < HEAD_DIM)
    return mask


@triton.jit
def load_kv_rows(Cache, outer, inner, off_hk, stride_b, stride_n, stride_h, offs_d, valid,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """A (rows, BLOCK_D) tile of cache rows at (outer, inner) of head off_hk; 0 where not valid."""
    return tl.load(kv_row_ptrs(Cache, outer, inner, off_hk, stride_b, stride_n, stride_h, offs_d),
                   mask=row_mask(valid, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
