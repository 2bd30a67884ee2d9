"""Block masks (FlexAttention's BlockMask): which key blocks a query block visits, and which keys of a partial
block each query sees. Shared by the portable flex kernels and the Gluon forward's block-sparse mode.

A query block's visit list is its partial blocks (kv_indices[:kv_num_blocks]) then its full ones
(full_kv_indices[:full_kv_num_blocks]); a partial block's mask is one bit per (query, key), 32 keys per int32 word,
SPARSE_KV / 32 words per query row, SPARSE_Q rows per block (portable/flex.partial_block_bits makes them).
"""

import triton
import triton.language as tl


@triton.jit
def visit_block(Indices, FullIndices, j, n_partial):
    """The key block of entry j of a visit list: Indices / FullIndices point at this query block's lists."""
    if j < n_partial:
        block = tl.load(Indices + j)
    else:
        block = tl.load(FullIndices + (j - n_partial))
    return block


@triton.jit
def partial_visible(MaskBits, block_id, rows, cols, SPARSE_Q: tl.constexpr, SPARSE_KV: tl.constexpr,
                    KEYS_BY_ROW: tl.constexpr = False):
    """Where query rows[i] may see key cols[j] of partial block block_id (rows and cols: places within the block,
    along the tile's two axes); KEYS_BY_ROW: a transposed tile, keys rows[i] and queries cols[j]."""
    WORDS: tl.constexpr = SPARSE_KV // 32
    base = MaskBits + block_id.to(tl.int64) * (SPARSE_Q * WORDS)
    if KEYS_BY_ROW:
        word = tl.load(base + cols[None, :] * WORDS + (rows // 32)[:, None])
        visible = ((word >> (rows % 32)[:, None]) & 1) != 0
    else:
        word = tl.load(base + rows[:, None] * WORDS + (cols // 32)[None, :])
        visible = ((word >> (cols % 32)[None, :]) & 1) != 0
    return visible
