"""Dropout on the attention probabilities, regenerated rather than stored.

Philox draws from a seed taken from torch's generator: the backward draws the same bits again, and
the counters (not the tile shape) decide them, so the forward, the backward and the test-only
probability dump agree whatever their tile sizes. One Philox call yields four 32-bit numbers, so each
call covers four neighbouring keys of one query row: counter (key // 4, query row, head).
"""

import triton
import triton.language as tl


@triton.jit
def _keep_rows_by_keys(seed, q_rows, k_cols, head_idx, dropout_p):
    """Keep mask of a queries x keys tile: q_rows (M, 1), k_cols (1, N) of consecutive keys whose
    first one is a multiple of 4 (tiles start at multiples of BLOCK_N >= 16)."""
    M: tl.constexpr = q_rows.shape[0]
    N: tl.constexpr = k_cols.shape[1]
    # the first key of each group of four, then its counter
    groups = tl.min(tl.reshape(k_cols, (1, N // 4, 4)), axis=2) // 4
    zero = tl.zeros((M, N // 4), dtype=tl.int32)
    c0 = (groups + zero).to(tl.uint32, bitcast=True)
    c1 = (q_rows + zero).to(tl.uint32, bitcast=True)
    c2 = (zero + head_idx).to(tl.uint32, bitcast=True)
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c2, zero.to(tl.uint32, bitcast=True))
    # interleave the four outputs back along the keys: key 4g + t takes output (0, 2, 1, 3)[t]
    r = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), (M, N))
    # the top 24 bits as a uniform float in [0, 1), exact in fp32
    u = (r >> 8).to(tl.float32) * 5.9604644775390625e-08
    return u >= dropout_p


@triton.jit
def dropout_keep(seed, q_idx, k_idx, head_idx, dropout_p):
    """True where a probability survives. q_idx and k_idx come pre-broadcast like score_mask's:
    (M, 1) and (1, N) for a queries x keys tile, or (1, M) and (N, 1) for keys x queries."""
    if k_idx.shape[1] == 1:
        # keys x queries (the dK/dV kernel): draw in queries x keys order, then transpose
        keep = tl.trans(_keep_rows_by_keys(seed, tl.trans(q_idx), tl.trans(k_idx), head_idx, dropout_p))
    else:
        keep = _keep_rows_by_keys(seed, q_idx, k_idx, head_idx, dropout_p)
    return keep
