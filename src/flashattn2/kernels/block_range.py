"""Which tiles a program visits.

Causal masks are aligned to the bottom-right corner (flash_attn >= 2.1): query i sees key j iff
j <= i + seqlen_k - seqlen_q. Each range is split into tiles that need no mask at all and tiles that
the diagonal or a sequence end crosses, so the mask arithmetic runs only where it can change a value.
"""

import triton
import triton.language as tl


@triton.jit
def kv_range_for_q_tile(start_m, seqlen_q, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        IS_CAUSAL: tl.constexpr):
    """Keys a query tile visits: [0, n_full) without a mask, then [n_full, n_end) with one.

    n_full is a multiple of BLOCK_N; tiles above the diagonal are never reached.
    """
    if IS_CAUSAL:
        diag = seqlen_k - seqlen_q
        last_row = tl.minimum(start_m + BLOCK_M, seqlen_q) - 1
        # one past the last key that the tile's last real row sees
        n_end = tl.maximum(tl.minimum(seqlen_k, last_row + diag + 1), 0)
        # keys that the tile's first row (and so every row) sees
        n_all = tl.maximum(tl.minimum(seqlen_k, start_m + diag + 1), 0)
    else:
        n_end = seqlen_k
        n_all = seqlen_k
    n_full = (n_all // BLOCK_N) * BLOCK_N
    return n_full, n_end


@triton.jit
def q_range_for_kv_tile(start_n, seqlen_q, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        IS_CAUSAL: tl.constexpr):
    """Query tiles a key tile is seen by: [m_begin, m_masked_end) with a mask, then
    [m_masked_end, m_end) without one. All bounds are multiples of BLOCK_M except m_end.

    A key tile cut by seqlen_k needs the mask everywhere. Rows past seqlen_q need none: they load
    lse = +inf, so their probabilities are exactly zero.
    """
    m_end = seqlen_q
    last_key = tl.minimum(start_n + BLOCK_N, seqlen_k) - 1
    if IS_CAUSAL:
        diag = seqlen_k - seqlen_q
        # first row that sees the tile's first key, and first row that sees its last key
        first_row = tl.minimum(tl.maximum(start_n - diag, 0), seqlen_q)
        all_row = tl.minimum(tl.maximum(last_key - diag, 0), seqlen_q)
        m_begin = (first_row // BLOCK_M) * BLOCK_M
        m_masked_end = tl.cdiv(all_row, BLOCK_M) * BLOCK_M
    else:
        m_begin = 0
        m_masked_end = 0
    if start_n + BLOCK_N > seqlen_k:
        m_masked_end = tl.cdiv(m_end, BLOCK_M) * BLOCK_M
    return m_begin, m_masked_end, m_end
