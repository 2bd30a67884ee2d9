"""Where one (batch, head) problem lives: dense batches or packed variable-length sequences."""

import triton
import triton.language as tl


@triton.jit
def sequence_bounds(off_b, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k, IS_VARLEN: tl.constexpr):
    """(first row of q, seqlen_q, first row of k, seqlen_k) of sequence off_b.

    Packed (varlen) inputs find their sequence in the cumulative lengths; dense ones start at row 0
    of their batch entry and share one length.
    """
    if IS_VARLEN:
        q_start = tl.load(CuSeqlensQ + off_b)
        k_start = tl.load(CuSeqlensK + off_b)
        seqlen_q = tl.load(CuSeqlensQ + off_b + 1) - q_start
        seqlen_k = tl.load(CuSeqlensK + off_b + 1) - k_start
    else:
        q_start = tl.full([], 0, tl.int32)
        k_start = tl.full([], 0, tl.int32)
    return q_start, seqlen_q, k_start, seqlen_k
