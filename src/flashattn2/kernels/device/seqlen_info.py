"""Where one (batch, head) problem lives: dense batches or packed variable-length sequences."""

import triton
import triton.language as tl

# The row counts of q and k that the kernels take only to clamp bad cu_seqlens: not worth a compiled
# variant per divisibility class, so every kernel that takes them leaves them unspecialised.
ROW_COUNTS = ("total_q", "total_k")


@triton.jit
def sequence_bounds(off_b, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k, total_q, total_k, IS_VARLEN: tl.constexpr):
    """(first row of q, seqlen_q, first row of k, seqlen_k) of sequence off_b.

    Packed (varlen) inputs find their sequence in the cumulative lengths; dense ones start at row 0
    of their batch entry and share one length. seqlen_q and seqlen_k come in as the longest sequence
    (the launch grid's size) and total_q, total_k as the rows of q and k: the bounds are clamped to
    them, so cumulative lengths that the host never read (cu_seqlens.check_and_poison judges them
    after the kernels) cannot move a load or store out of the tensors.
    """
    if IS_VARLEN:
        q_start = tl.minimum(tl.maximum(tl.load(CuSeqlensQ + off_b), 0), total_q)
        k_start = tl.minimum(tl.maximum(tl.load(CuSeqlensK + off_b), 0), total_k)
        q_end = tl.minimum(tl.maximum(tl.load(CuSeqlensQ + off_b + 1), q_start), total_q)
        k_end = tl.minimum(tl.maximum(tl.load(CuSeqlensK + off_b + 1), k_start), total_k)
        seqlen_q = tl.minimum(q_end - q_start, seqlen_q)
        seqlen_k = tl.minimum(k_end - k_start, seqlen_k)
    else:
        # int32 zeros spelled so that Gluon (which wants a layout for tl.full) compiles them too
        q_start = off_b * 0
        k_start = off_b * 0
    return q_start, seqlen_q, k_start, seqlen_k


@triton.jit
def query_bounds(off_b, CuSeqlensQ, seqlen_q, total_q, IS_VARLEN: tl.constexpr):
    """(first row of q, seqlen_q) of sequence off_b: the query half of sequence_bounds, for kernels whose keys
    come from elsewhere (the KV cache)."""
    if IS_VARLEN:
        q_start = tl.minimum(tl.maximum(tl.load(CuSeqlensQ + off_b), 0), total_q)
        q_end = tl.minimum(tl.maximum(tl.load(CuSeqlensQ + off_b + 1), q_start), total_q)
        seqlen_q = tl.minimum(q_end - q_start, seqlen_q)
    else:
        q_start = off_b * 0
    return q_start, seqlen_q


@triton.jit
def program_problem(nheads, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k, total_q, total_k, BLOCK: tl.constexpr,
                    IS_VARLEN: tl.constexpr):
    """What a program of a (row tiles, batch x heads) launch grid works on: (first row of its tile, batch,
    head, then sequence_bounds of that batch entry). The caller returns when its tile starts past its
    sequence (a packed sequence shorter than the longest one)."""
    start = tl.program_id(0) * BLOCK
    pid_bh = tl.program_id(1)
    off_b = pid_bh // nheads
    off_h = pid_bh % nheads
    q_start, seqlen_q, k_start, seqlen_k = sequence_bounds(off_b, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k,
                                                           total_q, total_k, IS_VARLEN)
    return start, off_b, off_h, q_start, seqlen_q, k_start, seqlen_k
