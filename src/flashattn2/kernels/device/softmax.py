"""Online softmax steps (FlashAttention-2, section 3.1.1), in log2 units so that exp2 does the work."""

import triton
import triton.language as tl


@triton.jit
def online_softmax_update(qk, m_i, l_i, qk_scale, MASKED: tl.constexpr, P_SHIFT: tl.constexpr = 0.0):
    """Fold one tile of raw scores qk (BLOCK_M, BLOCK_N; -inf where masked) into the running max m_i
    and sum l_i, both in log2 units.

    Returns the tile's unnormalised probabilities p, the factor alpha that rescales what was
    accumulated so far (it moves only when the running max moved), and the new m_i and l_i.
    With P_SHIFT, p and l_i carry a factor 2**P_SHIFT (finalize takes it out of the lse): FP8's P uses
    the e4m3 range up to 2**8 instead of underflowing below 2**-9.
    """
    # the scale is positive, so it commutes with max and folds into one multiply-add per score
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    if MASKED:
        # a row that has seen no key yet keeps m = -inf: shift it by 0 so that exp2 gives 0, not NaN
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_shift = m_new
    p_shift = m_shift
    if P_SHIFT != 0.0:
        p_shift = m_shift - P_SHIFT  # alpha, a ratio of old to new sums, keeps the unshifted max
    p = tl.math.exp2(qk * qk_scale - p_shift[:, None])
    alpha = tl.math.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_i


@triton.jit
def finalize(acc, m_i, l_i, P_SHIFT: tl.constexpr = 0.0, Sink=None, head=0):
    """Divide by the row sum once, at the end; rows that saw no key give 0 and lse = +inf.

    Sink (None, or (nheads,) learnable sinks, float32 or the inputs' dtype): sink[head] (head: a scalar or one per
    row) is one more logit of the row with no value (sinks.py). It joins the sum here, where the row's max and sum
    are known, so out is rounded once and lse includes it."""
    if Sink is not None:
        sink2 = tl.load(Sink + head).to(tl.float32) * 1.4426950408889634  # log2 units, like m_i
        top = tl.maximum(m_i, sink2)
        top = tl.where(top == float("-inf"), 0.0, top)  # a -inf sink on a row without keys: stays empty
        alpha = tl.math.exp2(m_i - top)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha + tl.math.exp2(sink2 - top + P_SHIFT)  # P_SHIFT: l carries 2**P_SHIFT (FP8)
        m_i = top
    empty = l_i == 0.0
    # one reciprocal a row, then a multiply a value: a division a value cost three instructions (sm_90 SASS)
    out = acc * (1.0 / tl.where(empty, 1.0, l_i))[:, None]
    log2_sum = m_i + tl.math.log2(tl.where(empty, 1.0, l_i))
    if P_SHIFT != 0.0:
        log2_sum = log2_sum - P_SHIFT
    lse = tl.where(empty, float("inf"), log2_sum * 0.6931471805599453)
    return out, lse
