"""Kernel launches at a small host cost.

`kernel[grid](...)` re-derives Triton's specialisation of every argument on every call (about 20 us
for our 40-60 arguments, more than the GPU time of a small attention). A Launch fixes everything but
the tensors: its first call goes through Triton, which compiles or loads the kernel and returns it;
later calls hand the tensors and the stored scalars straight to the compiled kernel's launcher.

That is only valid while Triton would pick the same compiled kernel: the owner of a Launch (a plan
in portable/forward.py, backward.py) keys it on everything Triton specialises on besides the stored values,
that is the dtypes and the 16-byte alignment of the tensors.
"""

import contextlib

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


class Launch:
    """kernel[grid](*tensors, *scalars, **named, num_warps=..., num_stages=...) for varying tensors.

    `scalars` are the plain numbers right after the tensors, `named` all the other arguments
    (runtime values and constexprs). Of the options every kernel may take (params.OPTION_ARGS, what
    AttnOptions.kernel_args() gives), those this kernel lacks are left out; any other name it lacks is an error."""

    __slots__ = ("kernel", "grid", "scalars", "named", "num_warps", "num_stages", "options", "compiling", "_compiled",
                 "_tail")

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
        self._compiled = self._tail = None

    def __call__(self, *tensors) -> None:
        compiled = self._compiled
        if compiled is not None and not _hooks_set():
            g = self.grid
            compiled.run(g[0], g[1], g[2], _current_stream(), compiled.function, compiled.packed_metadata, None, None,
                         None, *tensors, *self._tail)
            return
        with self.compiling():
            compiled = self.kernel[self.grid](*tensors, *self.scalars, **self.named, num_warps=self.num_warps,
                                              num_stages=self.num_stages, **self.options)
        if not INTERPRET and compiled is not None:
            # every argument after the tensors, in the kernel's parameter order
            names = self.kernel.arg_names[len(tensors) + len(self.scalars):]
            # parameters left out take their defaults, as Triton's own path gave them
            defaults = {p.name: p.default for p in getattr(self.kernel, "params", ()) if p.has_default}
            self._tail = (*self.scalars, *[self.named[name] if name in self.named else defaults[name]
                                           for name in names])
            self._compiled = compiled


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
