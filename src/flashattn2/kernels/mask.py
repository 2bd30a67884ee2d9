"""Score masks: sequence ends and the bottom-right-aligned causal diagonal."""

import triton
import triton.language as tl


@triton.jit
def score_mask(q_idx, k_idx, seqlen_q, seqlen_k, IS_CAUSAL: tl.constexpr):
    """True where query q_idx may attend to key k_idx.

    The indices come pre-broadcast (q_idx[:, None] with k_idx[None, :] for a queries x keys tile, the
    other way round for keys x queries), so a transposed tile needs no transposed mask.
    """
    mask = k_idx < seqlen_k
    if IS_CAUSAL:
        mask = mask & (k_idx <= q_idx + (seqlen_k - seqlen_q))
    return mask
