"""Compile-only probe (no GPU): the latent kernel's seesaw (SEESAW=1, READY_PARTS=2, EARLY_FREE=1) as a cluster of
2 head halves with multicast K tiles, from the unchanged src/ plus three monkeypatched @gluon.jit functions and
cluster_ptx's PTX hook; ptxas's registers / spills and the SASS's TMA and arrive counts against the baseline.

Not a runnable kernel: kv_empty's init counts are not doubled (that is in latent_decode_kernel's body, not patched
here), and no start handshake (see README). Run: PYTHONPATH=/tmp/t36:/work/main/src:. python probe_latent.py
"""

import contextlib
import re
import subprocess
import tempfile

from cluster_ptx import cluster_hook, peer_arrive_marker

from flashattn2.kernels.portable.kvcache import cache_sequence
from flashattn2.kernels.sm90 import latent
from flashattn2.kernels.sm90.gluon_api import gl, gluon, mbarrier, tma_load
from flashattn2.kernels.sm90.latent import (
    BLOCK_N,
    CHUNK,
    HALF_CHUNKS,
    HEADS,
    LATENT_V,
    STAGES,
    LatentSmem,
    LatentWork,
    _first_chunk,
    _page,
    free_phase,
)

BIN = "/tmp/t36/triton/backends/nvidia/bin"


@gluon.jit
def _work(CacheSeqlens, CacheBatchIdx, nheads, seqlen_q, capacity, cache_rows, NUM_SPLITS: gl.constexpr,
          HAS_RIGHT: gl.constexpr, HAS_SEQLENS: gl.constexpr, HAS_BATCH_IDX: gl.constexpr):
    """latent._work with grid (2 x seqlen_q, batch x head pairs, splits): x = 2 q_pos + half, the half the CTA's
    rank in its cluster of 2 along x (.reqnctapercluster 2, 1, 1)."""
    q_pos = gl.program_id(0) // 2
    half = gl.program_id(0) % 2
    pairs = nheads // (2 * HEADS)
    off_b = gl.program_id(1) // pairs
    head0 = ((gl.program_id(1) % pairs) * 2 + half) * HEADS
    split = gl.program_id(2)
    cache_len, _, kv_row, bits = cache_sequence(off_b, CacheSeqlens, None, CacheBatchIdx, 0, capacity, cache_rows,
                                                HAS_SEQLENS, False, HAS_BATCH_IDX)
    seqlen_k = gl.where(bits != 0, 0, cache_len).to(gl.int32)
    n_hi = seqlen_k
    if HAS_RIGHT:
        n_hi = gl.maximum(gl.minimum(n_hi, q_pos + 1 + seqlen_k - seqlen_q), 0)
    n_lo = n_hi * 0
    if NUM_SPLITS > 1:
        per_split = gl.cdiv(gl.cdiv(n_hi, BLOCK_N), NUM_SPLITS) * BLOCK_N
        n_lo = split * per_split
        n_hi = gl.minimum(n_hi, n_lo + per_split)
    return LatentWork(off_b, head0, q_pos, kv_row.to(gl.int32), n_lo, n_hi, bits)


@gluon.jit
def _load_tile(k_desc, sm: LatentSmem, w: LatentWork, i, BlockTable, stride_bt, page_size, num_pages,
               PAGED: gl.constexpr, PARTS: gl.constexpr = 1, EARLY_FREE: gl.constexpr = 0):
    """latent._load_tile with each box issued by one CTA of the pair (chunk c by rank c % 2: pred=), the expect
    still the whole part's bytes (the other CTA's boxes land here too once the hook makes them multicast)."""
    MAIN: gl.constexpr = LATENT_V // CHUNK
    gl.static_assert(not EARLY_FREE or PARTS == 2 or PARTS == 9, "EARLY_FREE needs READY_PARTS 2 or 9")
    rank = gl.program_id(0) % 2
    start_n = w.n_lo + i * BLOCK_N
    if start_n < w.n_hi:
        stage = i % STAGES
        outer, row, _ = _page(BlockTable, stride_bt, w.kv_row, start_n, page_size, num_pages, PAGED)
        if not EARLY_FREE:
            mbarrier.wait(sm.kv_empty.index(stage), free_phase(i, STAGES))
        for part in gl.static_range(PARTS):
            if EARLY_FREE:
                if _first_chunk(part, PARTS) == 0:
                    mbarrier.wait(sm.kv_empty.index(stage * 2), free_phase(i, STAGES))
                if _first_chunk(part, PARTS) == HALF_CHUNKS:
                    mbarrier.wait(sm.kv_empty.index(stage * 2 + 1), free_phase(i, STAGES))
            bar = sm.kv_ready.index(stage * PARTS + part)
            mbarrier.expect(bar, (_first_chunk(part + 1, PARTS) - _first_chunk(part, PARTS)) * k_desc.block_type.nbytes)
            for c in gl.static_range(_first_chunk(part, PARTS), _first_chunk(part + 1, PARTS)):
                mine = rank == c % 2
                if c < MAIN:
                    tma_load(k_desc, [outer, row, 0, c * CHUNK], bar, sm.k.index(stage).slice(c * CHUNK, CHUNK, dim=3),
                             pred=mine)
                else:
                    tma_load(k_desc, [outer, row, 0, LATENT_V], bar, sm.k_tail.index(stage), pred=mine)


@gluon.jit
def _free_both(bar):
    """This CTA's consumer done with a stage (half): one arrive here, one on the peer's barrier (the hook's
    mapa + mbarrier.arrive.shared::cluster); the barrier's count doubled in the kernel."""
    mbarrier.arrive(bar, count=1)
    peer_arrive_marker()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _seesaw_free(sm: LatentSmem, STAGE: gl.constexpr, W: gl.constexpr, EARLY_FREE: gl.constexpr):
    """latent._seesaw_free, each arrive on both CTAs' barriers."""
    if not EARLY_FREE:
        _free_both(sm.kv_empty.index(STAGE))
    elif STAGE == 0:
        _free_both(sm.kv_empty.index(W))
    else:
        if W == 0:
            _free_both(sm.kv_empty.index(2))
        _free_both(sm.kv_empty.index(3))


@contextlib.contextmanager
def patched():
    saved = {name: getattr(latent, name) for name in ("_work", "_load_tile", "_seesaw_free")}
    latent._work, latent._load_tile, latent._seesaw_free = _work, _load_tile, _seesaw_free
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(latent, name, fn)


def sass_counts(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([f"{BIN}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        elf = subprocess.run([f"{BIN}/cuobjdump", "-elf", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([f"{BIN}/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    counts = {k: len(re.findall(p, sass)) for k, p in (
        ("UTMALDG", r"UTMALDG\.\dD(?!\.MULTICAST)"), ("UTMALDG.MULTICAST", r"UTMALDG\.\dD\.MULTICAST"),
        ("remote arrive", r"SYNCS\.ARRIVE\.TRANS64\.RED"), ("HGMMA", r"HGMMA\."),
        ("spill LDL/STL", r"\b(?:LDL|STL)\b"))}
    counts["cluster attr"] = "EIATTR_CTA_PER_CLUSTER" in elf
    counts["res"] = re.search(r"REG:\d+ STACK:\d+", res).group(0)
    return counts


def compile_one(cluster: bool, **flags):
    log = {}
    hook = cluster_hook(desc_param=1, group=None, log=log) if cluster else contextlib.nullcontext()
    with patched() if cluster else contextlib.nullcontext(), hook:
        kernel = latent.compile_for_sm90(SEESAW=1, READY_PARTS=2, EARLY_FREE=1, **flags)
    md = kernel.metadata
    rewrites = {k: v for k, v in log.items() if k not in ("before", "after")}
    print(f"{'cluster ' if cluster else 'baseline'} {flags}: "
          f"shared={md.shared} warps={md.num_warps} {rewrites} {sass_counts(kernel.asm['cubin'])}")
    return kernel


if __name__ == "__main__":
    for flags in (dict(), dict(PAGED=True), dict(NUM_SPLITS=4), dict(PAGED=True, HAS_SEQLENS=True, HAS_RIGHT=True)):
        compile_one(False, **flags)
        compile_one(True, **flags)
