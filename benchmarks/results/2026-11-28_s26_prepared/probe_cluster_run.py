"""GPU probe (issue 27, latent multicast; step 1 and 2 of `2026-11-28_prepared/latent_multicast/README.md`'s verdict).

1. Does a kernel whose cluster shape is only in its PTX (`.reqnctapercluster 2, 1, 1`, added by cluster_ptx's hook
   to a num_ctas=1 Gluon compile) launch in clusters through Triton's plain launcher, with each K box multicast
   into both CTAs and the marked arrive landing on the peer's barrier? The tiny kernel of probe_multicast.py:
   each CTA of a pair stores the whole [64, 128] tile it received (box 0 loaded by CTA 0, box 1 by CTA 1) at rows
   rank x 64, so a right launch gives two equal copies of the source; a hang or a wrong half says which part broke.
2. How many clusters of 2 fit at once with the latent seesaw's shared memory (cuOccupancyMaxActiveClusters)? Batch
   64 at 128 heads needs 64 pairs in one wave; fewer means a second wave and a loss.

Run on a GPU from the repository root (TRITON_ALWAYS_COMPILE=1: triton 3.6 leaves the PTX hook out of its cache key):
    TRITON_ALWAYS_COMPILE=1 PYTHONPATH=src:benchmarks/results/2026-11-28_prepared/latent_multicast \
        timeout 120 python3 benchmarks/results/2026-11-28_s26_prepared/probe_cluster_run.py
"""

import ctypes
import re
import sys

import torch
import triton
from cluster_ptx import cluster_hook
from probe_multicast import tiny_cluster_kernel
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language._layouts import NVMMASharedLayout
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def max_active_clusters(function: int, threads: int, shared: int, with_attr: bool) -> tuple[int, int]:
    """(CUresult, clusters of 2 resident at once) for a launch of `threads` threads and `shared` bytes a CTA."""
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuFuncSetAttribute(ctypes.c_void_p(function), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 ctypes.c_int(shared))
    if rc:
        return rc, -1
    attr = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
    attr.value[0], attr.value[1], attr.value[2] = 2, 1, 1
    config = LaunchConfig(gridDimX=2 * 128, gridDimY=1, gridDimZ=1, blockDimX=threads, blockDimY=1, blockDimZ=1,
                          sharedMemBytes=shared, hStream=None, attrs=ctypes.pointer(attr) if with_attr else None,
                          numAttrs=1 if with_attr else 0)
    count = ctypes.c_int(-1)
    rc = cuda.cuOccupancyMaxActiveClusters(ctypes.byref(count), ctypes.c_void_p(function), ctypes.byref(config))
    return rc, count.value


def run_tiny() -> int:
    layout = NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    log = {}
    with cluster_hook(desc_param=0, group=2, log=log):
        kernel = triton.compile(GluonASTSource(tiny_cluster_kernel,
                                               dict(desc=f"tensordesc<bf16[64,64],{layout!r}>", Out="*i32"), {}),
                                target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    print("tiny: rewrites", {k: v for k, v in log.items() if k not in ("before", "after")},
          "cluster dims in PTX:", bool(re.search(r"\.reqnctapercluster 2, 1, 1", log["after"])), flush=True)
    src = (torch.arange(64 * 128, device="cuda") % 251).reshape(64, 128).to(torch.bfloat16)
    desc = TensorDescriptor.from_tensor(src, [64, 64], layout)
    out = torch.full((128 * 128 + 2,), -7, dtype=torch.int32, device="cuda")
    kernel[(2, 1, 1)](desc, out)
    torch.cuda.synchronize()
    want = src.to(torch.int32).flatten()
    tile = out[:128 * 128].view(128, 128)
    halves = [torch.equal(tile[r * 64:(r + 1) * 64].flatten(), want) for r in (0, 1)]
    boxes = [[torch.equal(tile[r * 64:(r + 1) * 64, c * 64:(c + 1) * 64], src[:, c * 64:(c + 1) * 64].to(torch.int32))
              for c in (0, 1)] for r in (0, 1)]
    print("tiny: CTA halves equal to the source:", halves, "by box [rank][box]:", boxes,
          "peer addresses:", out[-2:].tolist(), flush=True)
    ok = all(halves)
    # the same kernel launched 200 times (a pair a launch, then 66 pairs): a race or a lost arrive hangs or differs
    for grid_x in (2, 132):
        for _ in range(100):
            out.fill_(-7)
            kernel[(grid_x, 1, 1)](desc, out)
        torch.cuda.synchronize()
        again = all(torch.equal(out[:128 * 128].view(128, 128)[r * 64:(r + 1) * 64].flatten(), want) for r in (0, 1))
        print(f"tiny: 100 launches of {grid_x // 2} pair(s): last right: {again}", flush=True)
        ok = ok and again
    kernel._init_handles()
    for shared in (kernel.metadata.shared, 222_640):
        for with_attr in (False, True):
            rc, n = max_active_clusters(kernel.function, 128, shared, with_attr)
            print(f"tiny: clusters of 2 resident, 128 threads, {shared} B shared, launch attribute {with_attr}: "
                  f"{n} (CUresult {rc})", flush=True)
    return ok


def latent_clusters() -> None:
    """The seesaw compiled as a cluster of 2 (probe_latent's patches; not runnable: its empty counts are not
    doubled), loaded only for the occupancy query with its own threads, registers and shared memory."""
    import probe_latent

    log = {}
    with probe_latent.patched(), cluster_hook(desc_param=1, group=None, log=log):
        from flashattn2.kernels.sm90 import latent

        kernel = latent.compile_for_sm90(SEESAW=1, READY_PARTS=2, EARLY_FREE=1)
    threads = int(re.search(r"\.reqntid (\d+)", log["after"]).group(1))
    kernel._init_handles()
    shared = kernel.metadata.shared
    for with_attr in (False, True):
        rc, n = max_active_clusters(kernel.function, threads, shared, with_attr)
        print(f"latent seesaw (cluster build): {threads} threads, {shared} B shared, n_regs {kernel.n_regs}, "
              f"launch attribute {with_attr}: {n} clusters of 2 resident (CUresult {rc}); SMs "
              f"{torch.cuda.get_device_properties(0).multi_processor_count}", flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    good = run_tiny()
    latent_clusters()
    sys.exit(0 if good else 1)
