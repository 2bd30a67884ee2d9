"""Dropout on the attention probabilities, regenerated rather than stored.

One Philox draw per (head, query row, key) from a seed drawn from torch's generator: the backward
draws the same bits again, and the counters (not the tile shape) decide them, so the forward, the
backward and the test-only probability dump agree whatever their tile sizes.
"""

import triton
import triton.language as tl


@triton.jit
def dropout_keep(seed, q_idx, k_idx, head_idx, dropout_p):
    """True where a probability survives; q_idx and k_idx come pre-broadcast like score_mask's."""
    zero = q_idx * 0 + k_idx * 0
    c0 = (k_idx + zero).to(tl.uint32, bitcast=True)
    c1 = (q_idx + zero).to(tl.uint32, bitcast=True)
    c2 = (zero + head_idx).to(tl.uint32, bitcast=True)
    r, _, _, _ = tl.philox(seed, c0, c1, c2, zero.to(tl.uint32, bitcast=True))
    # the top 24 bits as a uniform float in [0, 1), exact in fp32
    u = (r >> 8).to(tl.float32) * 5.9604644775390625e-08
    return u >= dropout_p
