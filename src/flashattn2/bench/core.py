"""Benchmark core: shapes, FLOP counts, implementations, timing and peak memory.

Everything that touches the kernels is imported lazily, so this module (and the pure helpers the
tests use) imports on a machine without a GPU and while the kernels are still being written.
"""

import contextlib
import gc
import os
import re
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

OURS = "flashattn2"
# Default peers on a GPU, in the column order of the reports.
GPU_PEERS: tuple[str, ...] = ("sdpa-flash", "sdpa-cudnn", "sdpa-mem-eff", "naive")
# On CPU only these two exist (the fused SDPA backends are CUDA kernels).
CPU_PEERS: tuple[str, ...] = ("sdpa-math", "naive")
# flashattn2-triton: our own portable kernels with the Gluon backend switched off (backends.py)
ALL_PEERS: tuple[str, ...] = ("sdpa-flash", "sdpa-cudnn", "sdpa-mem-eff", "sdpa-math", "naive", "flashattn2-triton")
CUDA_ONLY_PEERS = frozenset({"sdpa-flash", "sdpa-cudnn", "sdpa-mem-eff"})

MODES: tuple[str, ...] = ("fwd", "bwd", "fwd_bwd")
# FLOPs of each mode relative to the forward (FlashAttention-2 paper convention: the backward does
# 5 matmuls against the forward's 2, hence 2.5x).
MODE_FLOP_FACTOR: dict[str, float] = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# FlashAttention-2 paper setup: fixed number of tokens per batch and fixed model width.
DEFAULT_SEQLENS: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_HDIMS: tuple[int, ...] = (64, 128, 256)
DEFAULT_DTYPES: tuple[str, ...] = ("bf16", "fp16")
DEFAULT_CAUSAL: tuple[bool, ...] = (False, True)
DEFAULT_TOTAL_TOKENS = 16384
DEFAULT_HIDDEN = 2048
QUICK_SEQLENS: tuple[int, ...] = (1024, 4096, 16384)
QUICK_HDIMS: tuple[int, ...] = (64, 128)
QUICK_DTYPES: tuple[str, ...] = ("bf16",)

DEFAULT_WARMUP_MS = 25.0
DEFAULT_REP_MS = 100.0
# Naive attention materialises several seqlen x seqlen tensors; past this share of free memory it
# would OOM or push the caching allocator into thrashing, so it is skipped instead.
NAIVE_MEM_FRACTION = 0.4

MIB = 2**20


# --------------------------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """One attention problem. seqlen_q == seqlen_k == seqlen throughout this benchmark."""

    batch: int
    seqlen: int
    nheads: int
    headdim: int
    causal: bool
    dtype: str  # key of DTYPES

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    def describe(self) -> str:
        return (
            f"{self.dtype} b={self.batch} s={self.seqlen} h={self.nheads} d={self.headdim} "
            f"causal={int(self.causal)}"
        )


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def paper_batch_nheads(seqlen: int, headdim: int, total_tokens: int, hidden: int) -> tuple[int, int]:
    """(batch, nheads) with batch * seqlen = total_tokens and nheads * headdim = hidden.

    A seqlen longer than total_tokens still gets batch 1 rather than an empty problem.
    """
    if seqlen <= 0 or headdim <= 0:
        raise ValueError(f"seqlen and headdim must be positive, got {seqlen}, {headdim}")
    if hidden % headdim:
        raise ValueError(f"hidden {hidden} is not a multiple of headdim {headdim}")
    return max(1, total_tokens // seqlen), hidden // headdim


def make_shapes(
    seqlens: Iterable[int] = DEFAULT_SEQLENS,
    hdims: Iterable[int] = DEFAULT_HDIMS,
    causals: Iterable[bool] = DEFAULT_CAUSAL,
    dtypes: Iterable[str] = DEFAULT_DTYPES,
    total_tokens: int = DEFAULT_TOTAL_TOKENS,
    hidden: int = DEFAULT_HIDDEN,
) -> list[Shape]:
    """All combinations, ordered dtype > hdim > causal > seqlen (the order of the report tables)."""
    seqlens, hdims, causals, dtypes = list(seqlens), list(hdims), list(causals), list(dtypes)
    for name in dtypes:
        torch_dtype(name)  # fail early on a typo rather than in the middle of a long run
    shapes = []
    for dtype in dtypes:
        for hdim in hdims:
            for causal in causals:
                for seqlen in seqlens:
                    batch, nheads = paper_batch_nheads(seqlen, hdim, total_tokens, hidden)
                    shapes.append(Shape(batch, seqlen, nheads, hdim, bool(causal), dtype))
    return shapes


# ---------------------------------------------------------------------------------------------- FLOPs


def attention_flops(
    batch: int,
    nheads: int,
    seqlen_q: int,
    seqlen_k: int,
    headdim: int,
    causal: bool = False,
    mode: str = "fwd",
) -> float:
    """Matmul FLOPs of attention: 2 matmuls of 2*s_q*s_k*d each in the forward; causal does half."""
    if mode not in MODE_FLOP_FACTOR:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    fwd = 4.0 * batch * nheads * seqlen_q * seqlen_k * headdim
    if causal:
        fwd /= 2
    return fwd * MODE_FLOP_FACTOR[mode]


def shape_flops(shape: Shape, mode: str) -> float:
    return attention_flops(
        shape.batch, shape.nheads, shape.seqlen, shape.seqlen, shape.headdim, shape.causal, mode
    )


def tflops_per_s(flops: float, ms: float | None) -> float | None:
    if ms is None or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12


# ------------------------------------------------------------------------------------ implementations

AttnFn = Callable[..., torch.Tensor]


def _ours_fn() -> AttnFn:
    # Lazy: the kernels may not exist yet, and importing them pulls in Triton.
    from flashattn2 import flash_attn_func

    return flash_attn_func


_SDPA_BACKENDS: dict[str, str] = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-mem-eff": "EFFICIENT_ATTENTION",
    "sdpa-math": "MATH",
}


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """What a typical model does: q k^T, masked softmax in fp32, cast back, times v. (b, h, s, d)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


@dataclass(frozen=True)
class Impl:
    """An attention implementation, with the tensor layout it natively wants."""

    name: str
    layout: str  # "bshd" (flash_attn API) or "bhsd" (SDPA / naive)
    ours_fn: AttnFn | None = None  # stand-in for flash_attn_func (tests, smoke runs)

    @property
    def cuda_only(self) -> bool:
        return self.name in CUDA_ONLY_PEERS

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """Backend selection for SDPA; entered around the whole measurement, not per call."""
        if self.name == "flashattn2-triton":
            return _triton_backend()
        backend = _SDPA_BACKENDS.get(self.name)
        if backend is None:
            return contextlib.nullcontext()
        return sdpa_kernel(getattr(SDPBackend, backend))

    def bind(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
    ) -> Callable[[], torch.Tensor]:
        """A zero-argument callable to time; anything it needs (e.g. the causal mask) is built here,
        outside the timed region."""
        if self.name == "flashattn2-triton":
            return lambda: _ours_fn()(q, k, v, causal=causal)
        if self.name == OURS:
            fn = self.ours_fn if self.ours_fn is not None else _ours_fn()
            return lambda: fn(q, k, v, causal=causal)
        if self.name in _SDPA_BACKENDS:
            # seqlen_q == seqlen_k here, so SDPA's top-left causal alignment equals flash_attn's
            # bottom-right one.
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if self.name == "naive":
            mask = None
            if causal:
                s_q, s_k = q.shape[-2], k.shape[-2]
                mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).triu(s_k - s_q + 1)
            return lambda: naive_attention(q, k, v, mask)
        raise ValueError(f"unknown implementation {self.name!r}")


@contextlib.contextmanager
def _triton_backend() -> Iterator[None]:
    import flashattn2

    before = flashattn2.get_backend()
    flashattn2.set_backend("triton")
    try:
        yield
    finally:
        flashattn2.set_backend(before)


def make_impl(name: str, ours_fn: AttnFn | None = None) -> Impl:
    if name == OURS:
        return Impl(OURS, "bshd", ours_fn)
    if name == "flashattn2-triton":
        return Impl(name, "bshd")
    if name in ALL_PEERS:
        return Impl(name, "bhsd")
    raise ValueError(f"unknown implementation {name!r}; expected {OURS} or one of {ALL_PEERS}")


def make_inputs(
    shape: Shape, layout: str, device: str | torch.device, requires_grad: bool, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v, dout in the implementation's own contiguous layout. Random normal: zeros would make
    every softmax uniform and could flatter kernels that skip work on special values."""
    b, s, h, d = shape.batch, shape.seqlen, shape.nheads, shape.headdim
    dims = (b, s, h, d) if layout == "bshd" else (b, h, s, d)
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = shape.torch_dtype
    q, k, v, dout = (torch.randn(dims, dtype=dtype, device=device, generator=gen) for _ in range(4))
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v, dout


def naive_score_bytes(batch: int, nheads: int, seqlen: int, with_grad: bool, elem_size: int = 2) -> int:
    """Rough peak of the seqlen x seqlen tensors naive attention holds at once.

    Forward without grad: scores (dtype) + fp32 copy + fp32 softmax + cast back, partly overlapping
    (~10 B/elem at 16 bits). With autograd the fp32 softmax and the cast probs are saved and the
    backward adds their gradients (~16 B/elem). Plus the bool causal mask.
    """
    per_elem = (16 if with_grad else 10) * elem_size // 2
    return batch * nheads * seqlen * seqlen * per_elem + seqlen * seqlen


# -------------------------------------------------------------------------------------------- timing


def _reset_grads(tensors: Sequence[torch.Tensor] | None) -> None:
    for t in tensors or ():
        t.grad = None


def time_call(
    fn: Callable[[], Any],
    device: str | torch.device,
    grad_to_none: Sequence[torch.Tensor] | None = None,
    warmup_ms: float = DEFAULT_WARMUP_MS,
    rep_ms: float = DEFAULT_REP_MS,
    cpu_reps: int = 3,
    trials: int = 1,
    back_to_back: bool = False,
) -> float:
    """Median milliseconds of fn(); with trials > 1, the lowest of that many medians.

    On CUDA: triton's do_bench (CUDA events, L2 flushed between runs), or with back_to_back, calls
    queued one after another without a flush, as a training loop makes them (back_to_back_ms). A
    whole do_bench call now and then reads 2-3x slow on the lent H100 (seen at seqlen <= 1k), so every
    implementation alike gets the best of `trials` medians. On CPU there are no CUDA events, so a few
    perf_counter repetitions.
    """
    if torch.device(device).type == "cuda" and back_to_back:
        return min(back_to_back_ms(fn, grad_to_none, warmup_ms, rep_ms) for _ in range(max(1, trials)))
    if torch.device(device).type == "cuda":
        import triton.testing

        return min(
            float(triton.testing.do_bench(
                fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=list(grad_to_none or []), return_mode="median"
            ))
            for _ in range(max(1, trials))
        )
    times = []
    for _ in range(max(1, cpu_reps)):
        _reset_grads(grad_to_none)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def back_to_back_ms(fn: Callable[[], Any], grad_to_none: Sequence[torch.Tensor] | None = None,
                    warmup_ms: float = DEFAULT_WARMUP_MS, rep_ms: float = DEFAULT_REP_MS, blocks: int = 5) -> float:
    """Milliseconds per call of fn() called back to back (host launches overlap the GPU's work, no cache
    flush between calls): the median over `blocks` blocks of calls, each timed by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run(n: int) -> float:
        start.record()
        for _ in range(n):
            _reset_grads(grad_to_none)
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n

    estimate = run(5)
    run(max(1, int(warmup_ms / max(estimate, 1e-3))))
    per_block = max(5, int(rep_ms / blocks / max(estimate, 1e-3)))
    return statistics.median(run(per_block) for _ in range(blocks))


def time_mode(
    call: Callable[[], torch.Tensor],
    mode: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    device: str | torch.device,
    warm: bool = True,
    **timing: Any,
) -> float:
    """Milliseconds of one mode. `warm` runs the timed step once first (Triton compiles on first
    call; do_bench also calls once, but the CPU path does not)."""
    leaves = [q, k, v]
    if mode == "fwd":
        # Inference forward: no graph, no saved tensors.
        with torch.no_grad():
            if warm:
                call()
            return time_call(call, device, None, **timing)
    if mode == "bwd":
        out = call()  # the one forward, outside the timer; its graph is reused by every backward

        def step() -> None:
            out.backward(dout, retain_graph=True)

    elif mode == "fwd_bwd":

        def step() -> None:
            call().backward(dout)

    else:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if warm:
        step()
        _reset_grads(leaves)
    return time_call(step, device, leaves, **timing)


_TRIGGERED = re.compile(r"\s*\(Triggered internally at[^)]*\)\.?")


def failure_reason(exc: BaseException, caught: Sequence[warnings.WarningMessage] = ()) -> str:
    """One short line: the error plus the warnings SDPA emits to say why a backend was refused."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "out of memory"
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()
    seen: list[str] = []
    for w in caught:
        msg = " ".join(_TRIGGERED.sub("", str(w.message)).split())
        if msg and msg not in seen:
            seen.append(msg)
    if seen:
        text += " [" + "; ".join(seen) + "]"
    return text if len(text) <= 300 else text[:297] + "..."


def free_memory(device: str | torch.device, collect: bool = False) -> None:
    """Drop cached blocks so the next configuration (up to 16k seqlen) gets the whole GPU.

    Reference counting already freed the tensors; a full gc pass is only worth it after an error.
    """
    if collect:
        gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _free_bytes(device: str | torch.device) -> int:
    return torch.cuda.mem_get_info(torch.device(device))[0]


class _Failures:
    """Records an implementation as None with a reason, for several modes at once."""

    def __init__(self, ms: dict[str, dict[str, float | None]], notes: dict[str, dict[str, str]]) -> None:
        self.ms, self.notes = ms, notes

    def __call__(self, modes: Iterable[str], name: str, reason: str) -> None:
        for m in modes:
            self.ms[m][name] = None
            self.notes[m][name] = reason


def _resolve_peers(peers: Iterable[str] | None, device: str | torch.device) -> list[str]:
    is_cuda = torch.device(device).type == "cuda"
    if peers is None:
        return list(GPU_PEERS if is_cuda else CPU_PEERS)
    peers = list(dict.fromkeys(peers))  # de-duplicate, keep order
    for p in peers:
        make_impl(p)  # validate names
    return [p for p in peers if p != OURS]


def run_suite(
    shapes: Iterable[Shape],
    modes: Iterable[str] = MODES,
    peers: Iterable[str] | None = None,
    device: str | torch.device = "cuda",
    *,
    warmup_ms: float = DEFAULT_WARMUP_MS,
    rep_ms: float = DEFAULT_REP_MS,
    cpu_reps: int = 3,
    trials: int = 1,
    back_to_back: bool = False,
    include_ours: bool = True,
    ours_fn: AttnFn | None = None,
    naive_mem_fraction: float = NAIVE_MEM_FRACTION,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Time ours and the peers on every shape and mode; one row per (shape, mode).

    Row keys: dtype, mode, hdim, causal, seqlen, batch, nheads, flops, ms {impl: ms|None},
    tflops {impl: TFLOP/s|None}, ratios {peer: ours TFLOP/s / peer TFLOP/s|None} (>1: ours is faster),
    notes {impl: why it is None}. Failures of any implementation are recorded, never raised.

    peers=None means sdpa-flash, sdpa-cudnn, sdpa-mem-eff, naive on CUDA and sdpa-math, naive on CPU;
    a CUDA-only peer asked for on CPU is recorded as None. ours_fn replaces flash_attn_func (same
    signature) for smoke runs while the kernels are not importable.
    """
    modes = list(modes)
    for m in modes:
        if m not in MODE_FLOP_FACTOR:
            raise ValueError(f"unknown mode {m!r}; expected one of {MODES}")
    dev = torch.device(device)
    is_cuda = dev.type == "cuda"
    names = ([OURS] if include_ours else []) + _resolve_peers(peers, dev)
    impls = [make_impl(n, ours_fn) for n in names]
    needs_grad = any(m != "fwd" for m in modes)
    timing = {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "cpu_reps": cpu_reps, "trials": trials,
              "back_to_back": back_to_back}

    rows: list[dict[str, Any]] = []
    for shape in shapes:
        ms: dict[str, dict[str, float | None]] = {m: {} for m in modes}
        notes: dict[str, dict[str, str]] = {m: {} for m in modes}

        fail = _Failures(ms, notes)
        for impl in impls:
            if impl.cuda_only and not is_cuda:
                fail(modes, impl.name, "needs a CUDA device")
                continue
            try:
                q, k, v, dout = make_inputs(shape, impl.layout, dev, needs_grad, seed)
                call = impl.bind(q, k, v, shape.causal)
            except Exception as exc:  # includes the import of ours failing
                fail(modes, impl.name, failure_reason(exc))
                free_memory(dev, collect=True)
                continue
            free = _free_bytes(dev) if is_cuda else None
            for mode in modes:
                if impl.name == "naive" and free is not None:
                    need = naive_score_bytes(
                        shape.batch, shape.nheads, shape.seqlen, mode != "fwd", shape.torch_dtype.itemsize
                    )
                    if need > naive_mem_fraction * free:
                        fail(
                            [mode],
                            impl.name,
                            f"skipped: score matrices need ~{need / 2**30:.1f} GiB > "
                            f"{naive_mem_fraction:.0%} of {free / 2**30:.1f} GiB free",
                        )
                        continue
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        with impl.context():
                            # Ours warms explicitly so Triton compiles outside the timer; on CUDA the
                            # peers rely on do_bench's own untimed first call (saves a slow naive run).
                            warm = impl.name == OURS or not is_cuda
                            ms[mode][impl.name] = time_mode(call, mode, q, k, v, dout, dev, warm, **timing)
                    except Exception as exc:
                        fail([mode], impl.name, failure_reason(exc, caught))
                        free_memory(dev, collect=True)
                _reset_grads([q, k, v])
            del q, k, v, dout, call
            free_memory(dev)

        for mode in modes:
            row = make_row(shape, mode, ms[mode], notes[mode])
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def make_row(
    shape: Shape, mode: str, ms: Mapping[str, float | None], notes: Mapping[str, str] | None = None
) -> dict[str, Any]:
    flops = shape_flops(shape, mode)
    tflops = {name: tflops_per_s(flops, t) for name, t in ms.items()}
    return {
        "dtype": shape.dtype,
        "mode": mode,
        "hdim": shape.headdim,
        "causal": shape.causal,
        "seqlen": shape.seqlen,
        "batch": shape.batch,
        "nheads": shape.nheads,
        "flops": flops,
        "ms": dict(ms),
        "tflops": tflops,
        "ratios": compute_ratios(tflops),
        "notes": dict(notes or {}),
    }


def compute_ratios(tflops: Mapping[str, float | None], ours: str = OURS) -> dict[str, float | None]:
    """ours / peer in throughput (equivalently peer time / our time); None if either is missing."""
    mine = tflops.get(ours)
    out: dict[str, float | None] = {}
    for name, val in tflops.items():
        if name == ours:
            continue
        out[name] = mine / val if mine is not None and val else None
    return out


# ---------------------------------------------------------------------------------------- first call


@contextlib.contextmanager
def fresh_triton_cache() -> Iterator[str]:
    """Point TRITON_CACHE_DIR at a new empty directory for the duration, then restore it and delete the dir.

    Triton looks the variable up when it compiles (and when it first builds its driver helpers), not at
    import, so this must be entered before the first kernel call; kernels already compiled in this process
    stay in Triton's in-memory cache and would not be recompiled.
    """
    old = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="flashattn2-triton-cache-") as path:
        os.environ["TRITON_CACHE_DIR"] = path
        try:
            yield path
        finally:
            if old is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = old


def first_call_shapes(shapes: Iterable[Shape]) -> list[Shape]:
    """The first shape of each (dtype, hdim, causal) combination, in run order: one compile each."""
    first: dict[tuple[str, int, bool], Shape] = {}
    for shape in shapes:
        first.setdefault((shape.dtype, shape.headdim, shape.causal), shape)
    return list(first.values())


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _wall_once(fn: Callable[[], Any], dev: torch.device) -> tuple[float, Any]:
    """Seconds of one call and its result; synchronised before, so earlier queued work is not counted, and
    after, so the kernels' run is."""
    _sync(dev)
    t0 = time.perf_counter()
    result = fn()
    _sync(dev)
    return time.perf_counter() - t0, result


def _first_call(impl: Impl, shape: Shape, dev: torch.device, with_bwd: bool, seed: int) -> tuple[float, float | None]:
    """(forward s, backward s or None); the tensors are freed when this returns."""
    q, k, v, dout = make_inputs(shape, impl.layout, dev, with_bwd, seed)
    call = impl.bind(q, k, v, shape.causal)  # imports the kernels; compiles nothing yet
    with torch.set_grad_enabled(with_bwd):
        fwd_s, out = _wall_once(call, dev)
    if not with_bwd:
        return fwd_s, None
    bwd_s, _ = _wall_once(lambda: out.backward(dout), dev)
    return fwd_s, bwd_s


def measure_first_calls(
    shapes: Iterable[Shape],
    modes: Iterable[str] = MODES,
    device: str | torch.device = "cuda",
    *,
    ours_fn: AttnFn | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Wall time of our very first forward and backward call of each (dtype, hdim, causal), JIT compile
    included: what a user waits for on a new shape. Run it before anything else calls the kernels in this
    process (run_suite's warm-ups would otherwise have compiled them). One forward and one backward per
    combination, on its first shape, nothing repeated.

    The forward runs with autograd on (the training call the backward needs) unless modes is just fwd,
    then under no_grad as the fwd benchmark does; bwd_s is None then. Entries: dtype, hdim, causal,
    seqlen, batch, nheads, fwd_s, bwd_s, note (why a value is None, else None). Failures are recorded.
    """
    dev = torch.device(device)
    with_bwd = any(m != "fwd" for m in modes)
    entries: list[dict[str, Any]] = []
    for shape in first_call_shapes(shapes):
        entry: dict[str, Any] = {
            "dtype": shape.dtype,
            "hdim": shape.headdim,
            "causal": shape.causal,
            "seqlen": shape.seqlen,
            "batch": shape.batch,
            "nheads": shape.nheads,
            "fwd_s": None,
            "bwd_s": None,
            "note": None,
        }
        try:
            entry["fwd_s"], entry["bwd_s"] = _first_call(make_impl(OURS, ours_fn), shape, dev, with_bwd, seed)
            free_memory(dev)
        except Exception as exc:
            entry["note"] = failure_reason(exc)
            free_memory(dev, collect=True)
        entries.append(entry)
        if on_row is not None:
            on_row(entry)
    return entries


# -------------------------------------------------------------------------------------------- memory


def measure_memory(
    seqlens: Iterable[int],
    peers: Iterable[str] | None = None,
    device: str | torch.device = "cuda",
    *,
    batch: int = 1,
    nheads: int = 16,
    headdim: int = 128,
    dtype: str = "bf16",
    include_ours: bool = True,
    ours_fn: AttnFn | None = None,
    naive_mem_fraction: float = NAIVE_MEM_FRACTION,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Extra memory of one forward+backward against seqlen (CUDA only).

    For each implementation: peak allocated during the call minus allocated before it (inputs and
    dout are already there), in MiB. Shows ours growing linearly in seqlen while naive is quadratic.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError("memory measurement needs a CUDA device")
    names = ([OURS] if include_ours else []) + _resolve_peers(peers, dev)
    impls = [make_impl(n, ours_fn) for n in names]
    result: dict[str, Any] = {
        "batch": batch,
        "nheads": nheads,
        "headdim": headdim,
        "dtype": dtype,
        "causal": False,
        "rows": [],
    }
    for seqlen in seqlens:
        shape = Shape(batch, seqlen, nheads, headdim, False, dtype)
        qkv_bytes = 3 * batch * seqlen * nheads * headdim * shape.torch_dtype.itemsize
        mib: dict[str, float | None] = {}
        notes: dict[str, str] = {}
        for impl in impls:
            free_memory(dev)
            if impl.name == "naive":
                need = naive_score_bytes(batch, nheads, seqlen, True, shape.torch_dtype.itemsize)
                free = _free_bytes(dev)
                if need > naive_mem_fraction * free:
                    mib[impl.name] = None
                    notes[impl.name] = (
                        f"skipped: score matrices need ~{need / 2**30:.1f} GiB > "
                        f"{naive_mem_fraction:.0%} of {free / 2**30:.1f} GiB free"
                    )
                    continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    mib[impl.name] = _peak_extra_mib(impl, shape, dev)
                except Exception as exc:
                    mib[impl.name] = None
                    notes[impl.name] = failure_reason(exc, caught)
        free_memory(dev)
        row = {"seqlen": seqlen, "qkv_mib": qkv_bytes / MIB, "mib": mib, "notes": notes}
        result["rows"].append(row)
        if on_row is not None:
            on_row(row)
    return result


def _peak_extra_mib(impl: Impl, shape: Shape, dev: torch.device) -> float:
    q, k, v, dout = make_inputs(shape, impl.layout, dev, True)
    call = impl.bind(q, k, v, shape.causal)
    with impl.context():
        # First call outside the measurement: Triton compilation and autotuning allocate scratch.
        call().backward(dout)
        _reset_grads([q, k, v])
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        call().backward(dout)
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev)
    return (peak - before) / MIB
