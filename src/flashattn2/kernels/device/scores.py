"""Score transforms that stop the softmax scale from folding into exp2: softcap and ALiBi.

Scores come out in log2 units: s2 = log2(e) * (softcap * tanh(scale * qk / softcap) - slope * |i + d - j|)
with d = seqlen_k - seqlen_q, the order flash_attn uses (softcap first, then the bias).
"""

import triton
import triton.language as tl

from ..common import LOG2E, mma
from .mask import score_mask, score_mask_rel


@triton.jit
def softcap_tanh(qk, softcap_in2):
    """tanh(scale * qk / softcap), with softcap_in2 = 2 * log2(e) * scale / softcap.

    1 - 2 / (exp(2x) + 1) saturates cleanly to +-1 where exp overflows or vanishes.
    """
    return 1.0 - 2.0 / (tl.math.exp2(qk * softcap_in2) + 1.0)


@triton.jit
def transformed_scores(qk, q_idx, k_idx, seqlen_q, seqlen_k, qk_scale, softcap_in2, softcap_out,
                       alibi_slope, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Raw q.k tile -> (scores in log2 units, tanh of the softcap for the backward).

    softcap_out is softcap * log2(e); alibi_slope is already multiplied by log2(e).
    """
    if HAS_SOFTCAP:
        t = softcap_tanh(qk, softcap_in2)
        s = t * softcap_out
    else:
        s = qk * qk_scale
        t = s  # unused without softcap; the compiler drops it
    if HAS_ALIBI:
        s = s - alibi_slope * tl.abs(q_idx + (seqlen_k - seqlen_q) - k_idx).to(tl.float32)
    return s, t


@triton.jit
def alibi_slope_of(AlibiSlopes, off_b, off_h, stride_alibi_b, HAS_ALIBI: tl.constexpr):
    """Head off_h's ALiBi slope for sequence off_b in log2 units (slopes are (nheads,) or (batch, nheads):
    stride_alibi_b is 0 for the first); 0.0 without ALiBi."""
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(AlibiSlopes + off_b.to(tl.int64) * stride_alibi_b + off_h) * LOG2E
    return slope


@triton.jit
def fp8_scales(QDescale, KDescale, VDescale, off_b, off_hk, nheads_k, qk_scale, softcap_in2):
    """FP8 inputs' (batch, kv head) descales folded into the score scales: (qk_scale, softcap_in2, v_descale),
    the last for the output. The descales are contiguous (batch, nheads_k) fp32."""
    at = off_b.to(tl.int64) * nheads_k + off_hk
    qk_descale = tl.load(QDescale + at) * tl.load(KDescale + at)
    return qk_scale * qk_descale, softcap_in2 * qk_descale, tl.load(VDescale + at)


@triton.jit
def score_tail(s, q_idx, k_idx, seqlen_q, seqlen_k, qk_scale, window_left, window_right, softcap_in2, softcap_out,
               alibi_slope, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               HAS_ALIBI: tl.constexpr, MASKED: tl.constexpr, MASK_REL: tl.constexpr = False):
    """What every kernel does to a tile of raw q.k scores, Gluon included: softcap and ALiBi, then the window and
    sequence-end mask (-inf where hidden) on MASKED tiles only. q_idx and k_idx come pre-broadcast, either way
    round; MASK_REL takes the mask as key - query offsets (mask.score_mask_rel, keys x queries tiles).

    Returns (scores, the scale that turns them into log2 units, tanh of the softcap for the backward)."""
    if HAS_SOFTCAP or HAS_ALIBI:
        # the transform needs the scaled scores: they come back in log2 units
        s, tanh_s = transformed_scores(s, q_idx, k_idx, seqlen_q, seqlen_k, qk_scale, softcap_in2, softcap_out,
                                       alibi_slope, HAS_SOFTCAP, HAS_ALIBI)
        scale_log2 = 1.0
    else:
        tanh_s = s  # unused without softcap; the compiler drops it
        scale_log2 = qk_scale
    if MASKED:
        if MASK_REL:
            visible = score_mask_rel(k_idx, q_idx, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT,
                                     HAS_RIGHT)
        else:
            visible = score_mask(q_idx, k_idx, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT, HAS_RIGHT)
        s = tl.where(visible, s, float("-inf"))
    return s, scale_log2, tanh_s


@triton.jit
def masked_scores(q, k, q_idx, k_idx, seqlen_q, seqlen_k, qk_scale, window_left, window_right, softcap_in2,
                  softcap_out, alibi_slope, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                  HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, MASKED: tl.constexpr,
                  INTERPRET: tl.constexpr):
    """q k^T of one tile, q rows against k rows, then score_tail. Returns what score_tail does."""
    return score_tail(mma(q, tl.trans(k), None, INTERPRET), q_idx, k_idx, seqlen_q, seqlen_k, qk_scale, window_left,
                      window_right, softcap_in2, softcap_out, alibi_slope, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                      HAS_ALIBI, MASKED)
