"""Compile-only probe (no GPU): a tiny triton 3.6 Gluon kernel made a cluster-of-2 kernel by cluster_ptx's PTX
rewrites (multicast TMA, peer mbarrier arrive, cluster dims), plus cluster rank / cluster barrier / mapa by
plain gl.inline_asm_elementwise. Writes before.ptx / after.ptx / tiny.cubin to OUT and checks the cubin with
ptxas and cuobjdump. Run: PYTHONPATH=/tmp/t36:/work/main/src python probe_multicast.py [OUT]
"""

import os
import re
import subprocess
import sys

import triton
from cluster_ptx import cluster_hook, cluster_rank, cluster_sync, peer_address, peer_arrive_marker
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

BIN = "/tmp/t36/triton/backends/nvidia/bin"


@gluon.jit
def tiny_cluster_kernel(desc, Out):
    """Each CTA: a [64, 128] bf16 tile as two [64, 64] boxes (after the rewrite: box 0 issued by CTA 0, box 1 by
    CTA 1, both multicast), its consumer frees the tile on both CTAs (count 2: the local and the peer's arrive),
    and the CTA stores the tile at rows rank x 64 (a different half per CTA, as the latent kernel's heads)."""
    smem = gl.allocate_shared_memory(desc.dtype, [2, 64, 64], desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(ready, count=1)
    mbarrier.init(empty, count=2)
    fence_async_shared()
    cluster_sync()
    rank = cluster_rank()
    mbarrier.expect(ready, 2 * desc.block_type.nbytes)  # the whole tile: both boxes land here
    for c in gl.static_range(2):
        tma.async_copy_global_to_shared(desc, [gl.program_id(1) * 64, c * 64], ready, smem.index(c))
    mbarrier.wait(ready, 0)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, layout))
    for c in gl.static_range(2):
        x = smem.index(c).load(layout)
        gl.store(Out + (rank * 64 + rows)[:, None] * 128 + c * 64 + cols[None, :], x)
    peer_arrive_marker()
    mbarrier.arrive(empty, count=1)  # -> the peer's `empty`
    mbarrier.arrive(empty, count=1)  # local
    mbarrier.wait(empty, 0)  # both CTAs done with the tile: a loader would refill the stage now
    gl.store(Out + 128 * 128 + rank, peer_address(rank))
    cluster_sync()  # no CTA exits while the peer may still arrive on its barrier
    mbarrier.invalidate(ready)
    mbarrier.invalidate(empty)


def main(out_dir):
    from triton.experimental.gluon.language._layouts import NVMMASharedLayout

    layout = NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    sig = dict(desc=f"tensordesc<bf16[64,64],{layout!r}>", Out="*i32")
    log = {}
    with cluster_hook(desc_param=0, group=2, log=log):
        kernel = triton.compile(GluonASTSource(tiny_cluster_kernel, sig, {}), target=GPUTarget("cuda", 90, 32),
                                options=dict(num_warps=4))
    print("rewrites:", {k: v for k, v in log.items() if k not in ("before", "after")})
    os.makedirs(out_dir, exist_ok=True)
    for name in ("before", "after"):
        with open(os.path.join(out_dir, f"tiny_{name}.ptx"), "w") as f:
            f.write(log[name])
    after = log["after"]
    for pat in (r"\.explicitcluster", r"\.reqnctapercluster[^\n]*", r"[^\n]*multicast::cluster[^\n]*",
                r"[^\n]*mapa[^\n]*", r"[^\n]*shared::cluster\.b64[^\n]*", r"[^\n]*barrier\.cluster[^\n]*",
                r"[^\n]*fence\.mbarrier_init[^\n]*", r"[^\n]*%cluster_ctarank[^\n]*"):
        for h in sorted(set(re.findall(pat, after)))[:4]:
            print("  ptx:", h.strip())
    cubin = os.path.join(out_dir, "tiny.cubin")
    with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
    # the rewritten PTX through ptxas by hand as well (triton.compile already ran it: make_cubin)
    ptx_file = os.path.join(out_dir, "tiny_after.ptx")
    r = subprocess.run([f"{BIN}/ptxas", "-arch=sm_90a", "-v", ptx_file, "-o", os.path.join(out_dir, "tiny_ptxas.o")],
                       capture_output=True, text=True)
    print("ptxas -arch=sm_90a rc", r.returncode, r.stderr.strip().replace("\n", " | ")[:600])
    r = subprocess.run([f"{BIN}/cuobjdump", "-elf", cubin], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if re.search(r"CLUSTER|EXPLICIT|CTA_PER|MAX_THREADS|REQNTID", line):
            print("  cuobjdump:", line.strip())
    r = subprocess.run([f"{BIN}/cuobjdump", "-sass", cubin], capture_output=True, text=True)
    sass = r.stdout
    for pat in (r"UTMALDG[^\n;]*", r"SYNCS[^\n;]*", r"UCGABAR[^\n;]*", r"CCTL[^\n;]*", r"MAPA[^\n;]*"):
        hits = sorted({h.strip() for h in re.findall(pat, sass)})
        for h in hits[:5]:
            print("  sass:", re.sub(r"\s+", " ", h))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/lm/tiny")
