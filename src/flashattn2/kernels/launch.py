"""Kernel launches at a small host cost.

`kernel[grid](...)` re-derives Triton's specialisation of every argument on every call (about 20 us
for our 40-60 arguments, more than the GPU time of a small attention). A Launch fixes everything but
the tensors: its first call goes through Triton, which compiles or loads the kernel and returns it;
later calls hand the tensors and the stored scalars straight to the compiled kernel's launcher.

That is only valid while Triton would pick the same compiled kernel: the owner of a Launch (a plan
in portable/forward.py, backward.py) keys it on everything Triton specialises on besides the stored values,
that is the dtypes and the 16-byte alignment of the tensors.

A TMA descriptor argument is passed as Tiles (the tensor, its tile shape and shared-memory layout). Triton's
launcher encodes every descriptor on every call (TensorDescriptor's checks, then cuTensorMapEncodeTiled: much of a
Gluon launch's host time, benchmarks/NOTES.md); a Launch encodes one once per base address and geometry, with
Triton's own encoder.
"""

import contextlib
import sys

import triton

from .common import INTERPRET
from .params import OPTION_ARGS


def _hook_set(hook) -> bool:
    # Triton keeps hooks in a chain (HookChain, empty unless a profiler such as proton adds one)
    return hook is not None and bool(getattr(hook, "calls", True))


def _hooks_set() -> bool:
    """True when something watches launches: then only Triton's own path calls the hooks."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    return runtime is None or _hook_set(runtime.launch_enter_hook) or _hook_set(runtime.launch_exit_hook)


_stream_of = None


def _current_stream() -> int:
    global _stream_of
    if _stream_of is None:
        import torch

        get_stream = triton.runtime.driver.active.get_current_stream
        _stream_of = lambda: get_stream(torch.cuda.current_device())  # noqa: E731
    return _stream_of()


class Tiles:
    """x read through a TMA descriptor of `block` tiles: `kind` (Triton's or Gluon's TensorDescriptor) is built only
    where Triton's own path needs one; otherwise Launch reuses the descriptor encoded for the same address and shape."""

    __slots__ = ("x", "block", "layout", "kind")

    def __init__(self, x, block: list[int], layout, kind) -> None:
        self.x, self.block, self.layout, self.kind = x, block, layout, kind

    def descriptor(self):
        x = self.x
        extra = () if self.layout is None else (self.layout,)
        return self.kind(x, list(x.shape), list(x.stride()), self.block, *extra)


def _plain(tensors: tuple) -> tuple:
    return tuple(t.descriptor() if type(t) is Tiles else t for t in tensors)


class _Encoded:
    """Triton 3.6's launcher below the step that encodes descriptor arguments (CudaLauncher.launch, a closure over
    the compiled C launcher): each Tiles argument's descriptor, encoded by Triton's own make_tensordesc_arg, is kept
    by (address, shape, strides), which with the launch's fixed dtype, tile and layout is all it encodes."""

    __slots__ = ("raw", "slots", "encode", "flags")
    LIMIT = 256  # descriptors kept a position: a stream of new addresses must not grow it without bound

    def __init__(self, raw, positions, metas, encode, flags) -> None:
        self.raw, self.encode, self.flags = raw, encode, flags
        self.slots = tuple((p, meta, {}) for p, meta in zip(positions, metas, strict=True))

    @classmethod
    def of(cls, compiled, tensors: tuple):
        """The direct launcher for this compiled kernel, or None where Triton's launcher is not laid out as in 3.6
        (other versions take Triton's path, which encodes each call) or a descriptor is not a positional Tiles."""
        run = compiled.run
        inner = getattr(run, "launch", None)
        code, cells = getattr(inner, "__code__", None), getattr(inner, "__closure__", None)
        module = sys.modules.get(type(run).__module__)
        encode = getattr(module, "make_tensordesc_arg", None)
        if code is None or not cells or encode is None or getattr(module, "_BASE_ARGS_FORMAT_LEN", None) != 13:
            return None
        free = dict(zip(code.co_freevars, (c.cell_contents for c in cells), strict=True))
        if set(free) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
            return None
        if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
            return None  # the launcher would allocate scratch each call
        positions, metas = sorted(free["tensordesc_indices"]), free["tensordesc_meta"]
        # metadata None: the descriptor goes as pointer, shapes and strides, holding the tensor; not kept
        if len(metas) != len(positions) or any(m is None for m in metas):
            return None
        if any(p >= len(tensors) or type(tensors[p]) is not Tiles for p in positions):
            return None
        flags = (run.launch_cooperative_grid, run.launch_pdl)
        return cls(free["launcher"], positions, metas, encode, flags)

    def __call__(self, grid, stream, compiled, tensors: tuple, tail: tuple) -> None:
        args, start = [], 0
        for p, meta, kept in self.slots:
            args += tensors[start:p]
            x = tensors[p].x
            key = (x.data_ptr(), x.shape, x.stride())
            encoded = kept.get(key)
            if encoded is None:
                if len(kept) >= self.LIMIT:
                    kept.clear()
                encoded = kept[key] = tuple(self.encode(tensors[p].descriptor(), meta))
            args += encoded
            start = p + 1
        args += tensors[start:]
        self.raw(grid[0], grid[1], grid[2], stream, compiled.function, *self.flags, None, None,
                 compiled.packed_metadata, None, None, None, *args, *tail)


class Launch:
    """kernel[grid](*tensors, *scalars, **named, num_warps=..., num_stages=...) for varying tensors.

    `scalars` are the plain numbers right after the tensors, `named` all the other arguments
    (runtime values and constexprs). Of the options every kernel may take (params.OPTION_ARGS, what
    AttnOptions.kernel_args() gives), those this kernel lacks are left out; any other name it lacks is an error."""

    __slots__ = ("kernel", "grid", "scalars", "named", "num_warps", "num_stages", "options", "compiling", "_compiled",
                 "_tail", "_tiles", "_encoded")

    def __init__(self, kernel, grid: tuple[int, int, int], scalars: tuple, named: dict, num_warps: int = 4,
                 num_stages: int = 2, options: dict | None = None, compiling=None) -> None:
        params = set(kernel.arg_names)
        unknown = sorted(name for name in named if name not in params and name not in OPTION_ARGS)
        if unknown:
            raise TypeError(f"{getattr(kernel, '__name__', kernel)} takes no argument(s) {unknown}")
        named = {name: value for name, value in named.items() if name in params}
        self.kernel, self.grid, self.scalars, self.named = kernel, grid, scalars, named
        self.num_warps, self.num_stages = num_warps, num_stages
        # further compile options (Gluon kernels: maxnreg)
        self.options = options or {}
        # a context manager entered around Triton's path, which compiles (sm90's free_registers)
        self.compiling = compiling or contextlib.nullcontext
        self._compiled = self._tail = self._encoded = None
        self._tiles = False

    def __call__(self, *tensors) -> None:
        compiled = self._compiled
        if compiled is not None and not _hooks_set():
            if self._encoded is not None:
                self._encoded(self.grid, _current_stream(), compiled, tensors, self._tail)
                return
            g = self.grid
            compiled.run(g[0], g[1], g[2], _current_stream(), compiled.function, compiled.packed_metadata, None, None,
                         None, *(_plain(tensors) if self._tiles else tensors), *self._tail)
            return
        plain = _plain(tensors)
        with self.compiling():
            compiled = self.kernel[self.grid](*plain, *self.scalars, **self.named, num_warps=self.num_warps,
                                              num_stages=self.num_stages, **self.options)
        if not INTERPRET and compiled is not None:
            # every argument after the tensors, in the kernel's parameter order
            names = self.kernel.arg_names[len(tensors) + len(self.scalars):]
            # parameters left out take their defaults, as Triton's own path gave them
            defaults = {p.name: p.default for p in getattr(self.kernel, "params", ()) if p.has_default}
            self._tail = (*self.scalars, *[self.named[name] if name in self.named else defaults[name]
                                           for name in names])
            self._compiled = compiled
            self._tiles = any(type(t) is Tiles for t in tensors)
            self._encoded = _Encoded.of(compiled, tensors) if self._tiles else None


class PlanCache(dict):
    """Plans by key, started afresh past a size (shapes are part of the keys: a stream of new shapes
    must not grow it without bound)."""

    def __init__(self, limit: int = 4096) -> None:
        super().__init__()
        self.limit = limit

    def add(self, key, plan):
        if len(self) >= self.limit:
            self.clear()
        self[key] = plan
        return plan


def align(x) -> int:
    """What Triton specialises a pointer on (and TMA needs): its offset from 16 bytes."""
    return x.data_ptr() & 15
