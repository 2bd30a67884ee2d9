"""Which tiles a program visits.

Masks are aligned to the bottom-right corner (flash_attn >= 2.1): query i sees key j iff
i + d - left <= j <= i + d + right with d = seqlen_k - seqlen_q (causal: right = 0, no left bound).
Each range splits into tiles that need no mask and tiles that a window edge or a sequence end
crosses, so the mask arithmetic runs only where it can change a value, and tiles outside the window
are never visited: the cost grows with the window, not with the sequence.
"""

import triton
import triton.language as tl


@triton.jit
def _clamp(x, lo, hi):
    return tl.minimum(tl.maximum(x, lo), hi)


@triton.jit
def kv_range_for_q_tile(start_m, seqlen_q, seqlen_k, window_left, window_right,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Keys a query tile visits, as n_lo <= n_full_lo <= n_full_hi <= n_hi:
    [n_lo, n_full_lo) and [n_full_hi, n_hi) need the mask, [n_full_lo, n_full_hi) does not. The first
    range is empty without a left window edge, so callers may skip it then."""
    diag = seqlen_k - seqlen_q
    last_row = tl.minimum(start_m + BLOCK_M, seqlen_q) - 1
    if HAS_RIGHT:
        n_hi = _clamp(last_row + diag + window_right + 1, 0, seqlen_k)
        full_hi = _clamp(start_m + diag + window_right + 1, 0, seqlen_k)
    else:
        n_hi = seqlen_k
        full_hi = seqlen_k
    if HAS_LEFT:
        n_lo = (_clamp(start_m + diag - window_left, 0, seqlen_k) // BLOCK_N) * BLOCK_N
        full_lo = tl.cdiv(_clamp(last_row + diag - window_left, 0, seqlen_k), BLOCK_N) * BLOCK_N
    else:
        n_lo = 0
        full_lo = 0
    full_hi = (full_hi // BLOCK_N) * BLOCK_N
    if full_lo >= full_hi:
        # no tile is seen whole by every row: the last masked range covers everything
        full_lo = n_lo
        full_hi = n_lo
    return n_lo, full_lo, full_hi, n_hi


@triton.jit
def q_range_for_kv_tile(start_n, seqlen_q, seqlen_k, window_left, window_right,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Query rows that see a key tile, as m_lo <= m_full_lo <= m_full_hi <= m_hi:
    [m_lo, m_full_lo) and [m_full_hi, m_hi) need the mask, [m_full_lo, m_full_hi) does not. The last
    range is empty without a left window edge, so callers may skip it then.

    A key tile cut by seqlen_k needs the mask everywhere. Rows past seqlen_q need none: they load
    lse = +inf, so their probabilities are exactly zero.
    """
    diag = seqlen_k - seqlen_q
    last_key = tl.minimum(start_n + BLOCK_N, seqlen_k) - 1
    if HAS_RIGHT:
        m_lo = (_clamp(start_n - diag - window_right, 0, seqlen_q) // BLOCK_M) * BLOCK_M
        full_lo = tl.cdiv(_clamp(last_key - diag - window_right, 0, seqlen_q), BLOCK_M) * BLOCK_M
    else:
        m_lo = 0
        full_lo = 0
    if HAS_LEFT:
        m_hi = _clamp(last_key - diag + window_left + 1, 0, seqlen_q)
        full_hi = (_clamp(start_n - diag + window_left + 1, 0, seqlen_q) // BLOCK_M) * BLOCK_M
    else:
        m_hi = seqlen_q
        full_hi = tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M
    if (full_lo >= full_hi) | (start_n + BLOCK_N > seqlen_k):
        # no row sees the tile whole (or the tile is cut by seqlen_k): the first masked range covers all
        full_lo = tl.maximum(m_hi, m_lo)
        full_hi = full_lo
    return m_lo, full_lo, full_hi, m_hi
