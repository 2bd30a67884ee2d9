"""The one place that names Gluon (`triton.experimental.gluon`), so that a renamed call in a new Triton
release is fixed here, not in every kernel.

Gluon is experimental: its calls moved between triton 3.6 (the version PyTorch 2.11 ships) and 3.9.
Each alias below picks the spelling the installed Triton has; module-level aliases are usable inside
`@gluon.jit` functions in both versions.
"""

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    AVAILABLE = True
except ImportError:  # a Triton without Gluon: only the portable kernels exist
    gluon = gl = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = None
    TensorDescriptor = None
    AVAILABLE = False

if AVAILABLE:
    # a class of named values passed to @gluon.jit functions as one argument; 3.6-3.9 keep it private
    aggregate = getattr(gl, "aggregate", None)
    if aggregate is None:
        from triton.language.core import _aggregate as aggregate
    # 3.6: async_copy_global_to_shared / async_copy_shared_to_global; 3.9: async_load / async_store
    tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
    tma_store_wait = tma.store_wait
    # a barrier of the calling partition's threads: 3.6 thread_barrier(), 3.9 barrier()
    thread_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
    NVMMASharedLayout = gl.NVMMASharedLayout
    if hasattr(tma, "async_atomic_add"):  # 3.8+
        tma_reduce_add = tma.async_atomic_add
    else:
        from triton._C.libtriton import ir as _ir
        from triton.experimental.gluon.language._core import builtin as _builtin

        @_builtin
        def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
            """3.6/3.7 export no bulk reduce, but their builder makes one: what 3.8's tma.async_atomic_add does."""
            coord = _semantic._convert_to_ir_values(coord, require_i64=False)
            _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                      src.handle)
else:
    tma_load = tma_store = tma_store_wait = tma_reduce_add = NVMMASharedLayout = aggregate = thread_barrier = None


def shared_layout(block_shape: list[int], torch_dtype):
    """The swizzled shared-memory layout TMA and wgmma both read, for a tile of that shape and dtype."""
    import torch

    dtype = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float8_e4m3fn: gl.float8e4nv,
             torch.float32: gl.float32}[torch_dtype]
    return NVMMASharedLayout.get_default_for(block_shape, dtype)
