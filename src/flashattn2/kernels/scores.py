"""Score transforms that stop the softmax scale from folding into exp2: softcap and ALiBi.

Scores come out in log2 units: s2 = log2(e) * (softcap * tanh(scale * qk / softcap) - slope * |i + d - j|)
with d = seqlen_k - seqlen_q, the order flash_attn uses (softcap first, then the bias).
"""

import triton
import triton.language as tl


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
