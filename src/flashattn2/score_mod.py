"""FlexAttention's score_mod as Triton code: a plain Python `score_mod(score, b, h, q_idx, kv_idx)` (closures over
captured tensors included) traced with torch.fx and emitted as `@triton.jit` functions that kernels call per score
tile, with its derivative in the score for the backward.

    mod = compile_score_mod(score_mod, device)
    mod.fn(score, b, h, q_idx, kv_idx, captures) -> the modified score (fp32), elementwise over broadcast tiles
    mod.grad(score, b, h, q_idx, kv_idx, captures) -> d score_mod / d score
    mod.captures: the captured tensors, contiguous on `device`, in the order `captures` takes them

The trace runs the mod once on one-element tensors (make_fx), so it sees the ops a mod applies, not Python control
flow on values (which a Flex mod cannot have either). Captured tensors are read with loads at the indices the mod
computes. The supported ops are those in _EMIT (arithmetic, comparisons, where, min/max/clamp, exp/log/tanh/
sigmoid/sqrt, integer floor division and remainder with Python's signs, dtype casts); any other raises
NotImplementedError naming it. The emitted source lives in a file (Triton reads a kernel's source), one per mod
and version of this module, under FLASHATTN2_CACHE_DIR (default ~/.cache/flashattn2).
"""

import hashlib
import importlib.util
import os
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.fx.experimental.proxy_tensor import make_fx

ARGS = ("score", "b", "h", "q_idx", "kv_idx")
_aten = torch.ops.aten


class CompiledMod(NamedTuple):
    fn: Callable
    grad: Callable
    captures: tuple[torch.Tensor, ...]
    source: str


def _binary(fmt: str) -> Callable:
    return lambda a: fmt.format(*a[:2])


def _floordiv(a) -> str:
    # Python's floor division (torch's floor_divide) on integers; Triton's // truncates toward zero
    x, m = a[:2]
    return f"(({x}) // ({m}) - ((({x}) % ({m}) != 0) & ((({x}) < 0) != (({m}) < 0))).to(tl.int32))"


def _remainder(a) -> str:
    # Python's sign rule (the divisor's), as torch.remainder; Triton's % takes the dividend's
    x, m = a[:2]
    return f"((({x}) % ({m}) + ({m})) % ({m}))"


def _clamp(a) -> str:
    x, lo, hi = (list(a) + [None, None])[:3]
    if lo not in (None, "None"):
        x = f"tl.maximum({x}, {lo})"
    if hi not in (None, "None"):
        x = f"tl.minimum({x}, {hi})"
    return x


_IDENTITY = (_aten.view.default, _aten._unsafe_view.default, _aten.expand.default, _aten.squeeze.default,
             _aten.squeeze.dim, _aten.unsqueeze.default, _aten.alias.default, _aten.clone.default,
             _aten.lift_fresh_copy.default, _aten.detach.default, _aten.reshape.default)
# keyword arguments of factory-like ops that say where and how a value lives, not what it is
_PLACEMENT = ("dtype", "layout", "device", "pin_memory", "memory_format")
_TL_DTYPES = {torch.float32: "tl.float32", torch.float64: "tl.float32", torch.float16: "tl.float16",
              torch.bfloat16: "tl.bfloat16", torch.int32: "tl.int32", torch.int64: "tl.int32", torch.bool: "tl.int1"}

_EMIT: dict = {
    **{op: _binary("({} + {})") for op in (_aten.add.Tensor, _aten.add.Scalar)},
    **{op: _binary("({} - {})") for op in (_aten.sub.Tensor, _aten.sub.Scalar)},
    **{op: _binary("({1} - {0})") for op in (_aten.rsub.Scalar, _aten.rsub.Tensor)},
    **{op: _binary("({} * {})") for op in (_aten.mul.Tensor, _aten.mul.Scalar)},
    **{op: _binary("(({}).to(tl.float32) / {})") for op in (_aten.div.Tensor, _aten.div.Scalar)},
    **{op: _floordiv for op in (_aten.floor_divide.default, _aten.floor_divide.Scalar)},
    **{op: _remainder for op in (_aten.remainder.Tensor, _aten.remainder.Scalar)},
    **{op: _binary("({} < {})") for op in (_aten.lt.Tensor, _aten.lt.Scalar)},
    **{op: _binary("({} <= {})") for op in (_aten.le.Tensor, _aten.le.Scalar)},
    **{op: _binary("({} > {})") for op in (_aten.gt.Tensor, _aten.gt.Scalar)},
    **{op: _binary("({} >= {})") for op in (_aten.ge.Tensor, _aten.ge.Scalar)},
    **{op: _binary("({} == {})") for op in (_aten.eq.Tensor, _aten.eq.Scalar)},
    **{op: _binary("({} != {})") for op in (_aten.ne.Tensor, _aten.ne.Scalar)},
    **{op: _binary("({} & {})") for op in (_aten.logical_and.default, _aten.bitwise_and.Tensor)},
    **{op: _binary("({} | {})") for op in (_aten.logical_or.default, _aten.bitwise_or.Tensor)},
    _aten.logical_not.default: lambda a: f"(({a[0]}) == 0)",
    _aten.bitwise_not.default: lambda a: f"(({a[0]}) == 0)",
    _aten.neg.default: lambda a: f"(-{a[0]})",
    _aten.sgn.default: lambda a: f"tl.where({a[0]} > 0, 1.0, tl.where({a[0]} < 0, -1.0, 0.0))",
    _aten.sign.default: lambda a: f"tl.where({a[0]} > 0, 1.0, tl.where({a[0]} < 0, -1.0, 0.0))",
    _aten.scalar_tensor.default: lambda a: a[0],
    _aten.abs.default: lambda a: f"tl.abs({a[0]})",
    _aten.exp.default: lambda a: f"tl.exp(({a[0]}).to(tl.float32))",
    _aten.log.default: lambda a: f"tl.log(({a[0]}).to(tl.float32))",
    _aten.sqrt.default: lambda a: f"tl.sqrt(({a[0]}).to(tl.float32))",
    _aten.rsqrt.default: lambda a: f"tl.rsqrt(({a[0]}).to(tl.float32))",
    _aten.sigmoid.default: lambda a: f"tl.sigmoid(({a[0]}).to(tl.float32))",
    # tanh through the sigmoid: exact in fp32 to a few ulps, and it saturates cleanly at both ends
    _aten.tanh.default: lambda a: f"(2.0 * tl.sigmoid(2.0 * ({a[0]}).to(tl.float32)) - 1.0)",
    _aten.tanh_backward.default: lambda a: f"({a[0]} * (1.0 - {a[1]} * {a[1]}))",
    _aten.sigmoid_backward.default: lambda a: f"({a[0]} * {a[1]} * (1.0 - {a[1]}))",
    _aten.minimum.default: _binary("tl.minimum({}, {})"),
    _aten.maximum.default: _binary("tl.maximum({}, {})"),
    _aten.clamp.default: _clamp,
    _aten.clamp_min.default: lambda a: _clamp([a[0], a[1], None]),
    _aten.clamp_max.default: lambda a: _clamp([a[0], None, a[1]]),
    _aten.where.self: lambda a: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    _aten.pow.Tensor_Scalar: lambda a: {"2": f"({a[0]} * {a[0]})", "2.0": f"({a[0]} * {a[0]})",
                                        "0.5": f"tl.sqrt({a[0]})"}.get(a[1])
    or _unsupported(f"pow with the exponent {a[1]} (0.5 and 2 are)"),
}


def _unsupported(what: str):
    raise NotImplementedError(f"flashattn2's score_mod compiler does not support {what}")


class _Emitter:
    def __init__(self, graph_module: torch.fx.GraphModule, device: torch.device, captures: list[torch.Tensor]):
        self.gm, self.device, self.captures, self.lines = graph_module, device, captures, []

    def arg(self, a) -> str:
        if isinstance(a, torch.fx.Node):
            return self.names[a]
        if isinstance(a, bool):
            return "1" if a else "0"
        if isinstance(a, (int, float)):
            return repr(float(a)) if isinstance(a, float) else str(a)
        if a is None:
            return "None"
        raise NotImplementedError(f"flashattn2's score_mod compiler cannot take the argument {a!r}")

    def capture(self, node: torch.fx.Node) -> int:
        tensor = getattr(self.gm, node.target)
        for i, t in enumerate(self.captures):
            if t is tensor:
                return i
        self.captures.append(tensor)
        return len(self.captures) - 1

    def emit(self) -> list[str]:
        self.names, placeholders = {}, 0
        for i, node in enumerate(self.gm.graph.nodes):
            name = f"v{i}"
            if node.op == "placeholder":
                self.names[node] = ARGS[placeholders]
                placeholders += 1
                continue
            if node.op == "get_attr":
                self.names[node] = f"captures[{self.capture(node)}]"
                continue
            if node.op == "output":
                (result,) = node.args
                value = self.arg(result[0] if isinstance(result, (list, tuple)) else result)
                # a tile of the score's shape even where the value is a constant (the derivative of score + bias);
                # a where() broadcasts in Gluon kernels too, which zeros_like (no layout) does not
                self.lines.append(f"return tl.where(score == score, {value}, {value}).to(tl.float32)")
                continue
            target = node.target
            args = node.args
            if target in _IDENTITY or target in (_aten.sum.dim_IntList, _aten.sum.default):  # one-element traces
                expr = self.arg(args[0])
            elif target in (_aten.ones_like.default, _aten.zeros_like.default):
                expr = "1.0" if target == _aten.ones_like.default else "0.0"
            elif target in (_aten._to_copy.default, _aten.to.dtype):
                dtype = node.kwargs.get("dtype", args[1] if len(args) > 1 else None)
                expr = f"({self.arg(args[0])}).to({_TL_DTYPES.get(dtype, 'tl.float32')})"
            elif target == _aten.index.Tensor:
                tensor = getattr(self.gm, args[0].target) if args[0].op == "get_attr" else None
                if tensor is None or len(args[1]) != tensor.dim():
                    raise NotImplementedError("flashattn2's score_mod compiler reads captured tensors only at one "
                                              "index per dimension (table[i, j])")
                strides = tensor.contiguous().stride()
                offset = " + ".join(f"({self.arg(ix)}) * {s}" for ix, s in zip(args[1], strides, strict=True))
                expr = f"tl.load({self.names[args[0]]} + {offset})"
            elif target in _EMIT:
                values = [v for key, v in node.kwargs.items() if key not in _PLACEMENT]
                expr = _EMIT[target]([self.arg(a) for a in args] + [self.arg(v) for v in values])
            else:
                raise NotImplementedError(f"flashattn2's score_mod compiler does not support {target}")
            self.names[node] = name
            self.lines.append(f"{name} = {expr}")
        return self.lines


def _example_args(device: torch.device) -> tuple[torch.Tensor, ...]:
    # one-element tensors: indexing a captured tensor with them traces as aten.index, not a .item(); at 0, an index
    # that every captured tensor has (a table of one head's slopes included)
    ints = [torch.zeros(1, dtype=torch.int32, device=device) for _ in range(4)]
    return (torch.full((1,), 0.5, device=device), *ints)


def _traced(score_mod: Callable, device: torch.device):
    fn = make_fx(score_mod)(*_example_args(device))

    def summed(score, b, h, q_idx, kv_idx):
        return score_mod(score, b, h, q_idx, kv_idx).sum()

    grad = make_fx(torch.func.grad(summed))(*_example_args(device))
    return fn, grad


def _cache_dir() -> str:
    path = os.environ.get("FLASHATTN2_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "flashattn2"))
    path = os.path.join(path, "score_mods")
    os.makedirs(path, exist_ok=True)
    return path


def compile_score_mod(score_mod: Callable, device: str | torch.device = "cuda") -> CompiledMod:
    """The @triton.jit functions of score_mod and of its derivative in the score (see the module's docstring)."""
    device = torch.device(device)
    fn_graph, grad_graph = _traced(score_mod, device)
    captures: list[torch.Tensor] = []
    bodies = [_Emitter(graph, device, captures).emit() for graph in (fn_graph, grad_graph)]
    signature = ", ".join(ARGS) + ", captures"
    source = ["import triton", "import triton.language as tl", ""]
    for name, body in zip(("score_mod", "score_mod_grad"), bodies, strict=True):
        source += ["", "@triton.jit", f"def {name}({signature}):"] + [f"    {line}" for line in body] + [""]
    source = "\n".join(source)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = os.path.join(_cache_dir(), f"mod_{digest}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # whole or not at all, for processes compiling the same mod together
    spec = importlib.util.spec_from_file_location(f"flashattn2_score_mod_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return CompiledMod(module.score_mod, module.score_mod_grad,
                       tuple(t.detach().contiguous().to(device) for t in captures), source)
