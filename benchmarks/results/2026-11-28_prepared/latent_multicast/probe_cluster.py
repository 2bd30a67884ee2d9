"""Compile-only probe (no GPU): can a triton 3.6 Gluon kernel run as a cluster of 2 CTAs on sm_90a?

Compiles a tiny TMA-load kernel (and variants) with num_ctas 1 and 2 and prints what the PTX / metadata show.
Run: PYTHONPATH=/tmp/t36:/work/main/src python probe_cluster.py [case ...]
"""

import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

TARGET = GPUTarget("cuda", 90, 32)


@gluon.constexpr_function
def _blocked(cga):
    return gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], [list(b) for b in cga])


@gluon.jit
def tma_kernel(desc, Out, CGA: gl.constexpr):
    """One [64, 64] bf16 box by TMA into shared memory, then to registers and out. CGA: the cga_layout bases
    every layout carries (empty: the default, one CTA's view)."""
    smem = gl.allocate_shared_memory(desc.dtype, [64, 64], desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    fence_async_shared()
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [gl.program_id(0) * 64, 0], bar, smem)
    mbarrier.wait(bar, 0)
    layout: gl.constexpr = _blocked(CGA)
    x = smem.load(layout)
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, layout))
    gl.store(Out + (gl.program_id(0) * 64 + rows)[:, None] * 64 + cols[None, :], x)
    mbarrier.invalidate(bar)


@gluon.constexpr_function
def _mma(cga):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16],
                                     cga_layout=[list(b) for b in cga])


@gluon.jit
def _wg_consumer(smem, bar, Out, CGA: gl.constexpr):
    mbarrier.wait(bar, 0)
    acc = warpgroup_mma(smem, smem.permute([1, 0]), gl.zeros([64, 64], gl.float32, _mma(CGA)), is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, _mma(CGA)))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, _mma(CGA)))
    gl.store(Out + (gl.program_id(1) * 64 + rows)[:, None] * 64 + cols[None, :], acc)


@gluon.jit
def _wg_loader(desc, smem, bar):
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [gl.program_id(0) * 64, 0], bar, smem)


@gluon.jit
def ws_wgmma_kernel(desc, Out, CGA: gl.constexpr):
    """A loader warp (TMA) and a consumer warpgroup (wgmma S = K K^T) by gl.warp_specialize, as the seesaw."""
    smem = gl.allocate_shared_memory(desc.dtype, [64, 64], desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    fence_async_shared()
    gl.warp_specialize([(_wg_consumer, (smem, bar, Out, CGA)), (_wg_loader, (desc, smem, bar))], [1], [24])
    mbarrier.invalidate(bar)


@gluon.jit
def asm_memdesc_kernel(Out):
    """Can an inline asm take a shared-memory buffer (for its address)? (No: not a tensor.)"""
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    x = gl.inline_asm_elementwise("mov.u32 $0, $1;", "=r,r", [bar], dtype=gl.int32, is_pure=True, pack=1)
    gl.store(Out, x)


def compile_case(fn, signature, constexprs, num_ctas, desc=None):
    src = GluonASTSource(fn, signature, constexprs)
    return triton.compile(src, target=TARGET, options=dict(num_warps=4, num_ctas=num_ctas))


def describe(kernel, label):
    ptx = kernel.asm["ptx"]
    md = kernel.metadata
    print(f"== {label}: num_ctas={md.num_ctas} cluster_dims={getattr(md, 'cluster_dims', None)} "
          f"shared={md.shared} pack_metadata={kernel.packed_metadata if hasattr(kernel, 'packed_metadata') else ''}")
    for pat in (r"\.reqnctapercluster[^\n]*", r"\.explicitcluster[^\n]*", r"cp\.async\.bulk\.tensor[^\n]*",
                r"mov\.u32[^\n]*%(?:cluster|ctaid|nctaid)[^\n]*", r"wgmma\.mma_async[^\n]*",
                r"@%p\d+ st\.global\.[^\n]*"):
        hits = sorted(set(re.findall(pat, ptx)))
        for h in hits[:3]:
            print("   ", h.strip())
    for reg in re.findall(r"mov\.u32\s+(%r\d+), %cluster_ctarank;", ptx):  # what Triton does with the rank
        for line in [x for x in ptx.splitlines() if re.search(rf"{reg}\b", x) and "cluster_ctarank" not in x][:2]:
            print("    uses", reg + ":", line.strip())
    return ptx


def tma_case(num_ctas, cga, kernel=None):
    from triton.experimental.gluon.language._layouts import NVMMASharedLayout

    layout = NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    if cga:
        layout = NVMMASharedLayout(layout.swizzle_byte_width, 16, rank=2, cga_layout=cga)
    out = "*fp32" if kernel is not None else "*bf16"
    sig = dict(desc=f"tensordesc<bf16[64,64],{layout!r}>", Out=out, CGA="constexpr")
    return compile_case(kernel or tma_kernel, sig, {(2,): cga}, num_ctas)


CASES = {
    "tma1": lambda: describe(tma_case(1, []), "tma kernel, num_ctas=1"),
    "tma2": lambda: describe(tma_case(2, []), "tma kernel, num_ctas=2, layouts without cga_layout"),
    "tma2bcast": lambda: describe(tma_case(2, [[0, 0]]), "tma kernel, num_ctas=2, cga_layout=[[0,0]] (broadcast)"),
    "ws2": lambda: describe(tma_case(2, [[0, 0]], ws_wgmma_kernel),
                            "warp_specialize + wgmma, num_ctas=2, cga_layout=[[0,0]] everywhere"),
    "asm_memdesc": lambda: compile_case(asm_memdesc_kernel, dict(Out="*i32"), {}, 1),
}

if __name__ == "__main__":
    print("triton", triton.__version__)
    for name in sys.argv[1:] or list(CASES):
        try:
            CASES[name]()
        except Exception as e:  # a probe: report and go on
            msg = str(e).strip().splitlines()
            print(f"== {name}: FAILED {type(e).__name__}: " + msg[-1][:400])
