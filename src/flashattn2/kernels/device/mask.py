"""Score masks: sequence ends and a bottom-right-aligned window (causal is the window (-1, 0))."""

import triton
import triton.language as tl


@triton.jit
def score_mask(q_idx, k_idx, seqlen_q, seqlen_k, window_left, window_right,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """True where query q_idx may attend to key k_idx:
    q_idx + seqlen_k - seqlen_q - window_left <= k_idx <= q_idx + seqlen_k - seqlen_q + window_right.

    The indices come pre-broadcast (q_idx[:, None] with k_idx[None, :] for a queries x keys tile, the
    other way round for keys x queries), so a transposed tile needs no transposed mask.
    """
    diag = q_idx + (seqlen_k - seqlen_q)
    if HAS_RIGHT:
        # the window's right edge and the keys' end as one limit a query: one compare a score, not two (sm_90,
        # the Gluon d128 causal forward: 6,296 -> 5,952 instructions, +3-5% at 512-2k tokens; benchmarks/NOTES.md)
        mask = k_idx <= tl.minimum(diag + window_right, seqlen_k - 1)
    else:
        mask = k_idx < seqlen_k
    if HAS_LEFT:
        mask = mask & (k_idx >= diag - window_left)
    return mask


@triton.jit
def score_mask_rel(k_idx, q_idx, seqlen_q, seqlen_k, window_left, window_right,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """score_mask for a keys x queries tile (k_idx[:, None] with q_idx[None, :]), tested on the offset
    key - query against scalars: the Gluon backward's form, where score_mask's loop-invariant broadcasts
    were hoisted out of the query loop and spilled (benchmarks/NOTES.md)."""
    rel = k_idx - q_idx
    diag = seqlen_k - seqlen_q
    mask = k_idx < seqlen_k
    if HAS_RIGHT:
        mask = mask & (rel <= diag + window_right)
    if HAS_LEFT:
        mask = mask & (rel >= diag - window_left)
    return mask
