"""python -m flashattn2.bench: FlashAttention-2 paper benchmark of flashattn2 against its peers.

Writes <out-dir>/<tag or YYYY-MM-DD_device>.json and prints a line per measurement (its markdown report:
python benchmarks/report_bench.py FILE.json; its PNG: python benchmarks/plot_bench.py FILE.json).
"""

import argparse
import contextlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from .core import (
    ALL_PEERS,
    DEFAULT_DTYPES,
    DEFAULT_HDIMS,
    DEFAULT_HIDDEN,
    DEFAULT_REP_MS,
    DEFAULT_SEQLENS,
    DEFAULT_TOTAL_TOKENS,
    DEFAULT_WARMUP_MS,
    DTYPES,
    GPU_PEERS,
    MODES,
    OURS,
    QUICK_DTYPES,
    QUICK_HDIMS,
    QUICK_SEQLENS,
    fresh_triton_cache,
    make_shapes,
    measure_first_calls,
    measure_memory,
    run_suite,
)
from .report import (
    collect_meta,
    default_stem,
    first_call_line,
    markdown_table,
    memory_line,
    stdout_header,
    stdout_line,
    write_json,
)

NO_CUDA_MESSAGE = (
    "no CUDA GPU: the benchmark needs one; `python -m flashattn2` runs a CPU check through the "
    "Triton interpreter"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m flashattn2.bench",
        description=(
            "Benchmark flashattn2 against torch SDPA (flash, cuDNN, memory-efficient) and naive attention, "
            "FlashAttention-2 paper setup: batch = total_tokens / seqlen, nheads = hidden / headdim."
        ),
    )
    # None defaults so that --quick can fill in its subset without overriding explicit flags.
    p.add_argument("--seqlens", type=int, nargs="+", help=f"default {' '.join(map(str, DEFAULT_SEQLENS))}")
    p.add_argument("--hdims", type=int, nargs="+", help=f"default {' '.join(map(str, DEFAULT_HDIMS))}")
    p.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), help=f"default {' '.join(DEFAULT_DTYPES)}")
    p.add_argument("--causal", choices=("0", "1", "both"), default="both", help="default both")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="default fwd bwd fwd_bwd")
    p.add_argument(
        "--peers",
        nargs="*",
        choices=ALL_PEERS,
        default=list(GPU_PEERS),
        help=f"implementations to compare with {OURS} (default {' '.join(GPU_PEERS)}; none: just ours)",
    )
    p.add_argument("--total-tokens", type=int, default=DEFAULT_TOTAL_TOKENS, help="batch * seqlen (16384)")
    p.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN, help="nheads * headdim (2048)")
    p.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_MS, help="do_bench warmup, ms (25)")
    p.add_argument("--rep", type=float, default=DEFAULT_REP_MS, help="do_bench repetition time, ms (100)")
    p.add_argument("--trials", type=int, default=2,
                   help="do_bench calls per measurement, best median kept, same for every implementation (2)")
    p.add_argument("--back-to-back", action="store_true",
                   help="time calls queued back to back without flushing the L2 cache between them (the way a "
                        "training loop runs; host time that the GPU work does not cover shows up)")
    p.add_argument("--out-dir", default="benchmarks/results", help="default benchmarks/results")
    p.add_argument("--tag", help="result file name stem (default YYYY-MM-DD_<device>)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small subset: bf16, hdims 64 128, seqlens 1024 4096 16384 (explicit flags still win)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--mem-batch", type=int, default=1, help="memory measurement batch (1)")
    p.add_argument("--mem-nheads", type=int, default=16, help="memory measurement heads (16)")
    p.add_argument("--mem-hdim", type=int, default=128, help="memory measurement headdim (128)")
    p.add_argument("--mem-dtype", choices=sorted(DTYPES), default="bf16", help="memory measurement dtype")
    p.add_argument(
        "--cold-cache",
        action="store_true",
        help="compile into a fresh, temporary TRITON_CACHE_DIR so the first-call times include the whole "
        "compile (default: Triton's own cache, where an earlier run's kernels are only loaded)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    # Set before anything can compile a kernel: Triton reads TRITON_CACHE_DIR when it compiles.
    with fresh_triton_cache() if args.cold_cache else contextlib.nullcontext():
        return _run(args, argv)


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    seqlens = args.seqlens or list(QUICK_SEQLENS if args.quick else DEFAULT_SEQLENS)
    hdims = args.hdims or list(QUICK_HDIMS if args.quick else DEFAULT_HDIMS)
    dtypes = args.dtypes or list(QUICK_DTYPES if args.quick else DEFAULT_DTYPES)
    causals = {"0": [False], "1": [True], "both": [False, True]}[args.causal]

    if not torch.cuda.is_available():
        print(NO_CUDA_MESSAGE, file=sys.stderr)
        return 2

    start = time.perf_counter()
    device = "cuda"
    device_name = torch.cuda.get_device_name(0)
    try:
        shapes = make_shapes(seqlens, hdims, causals, dtypes, args.total_tokens, args.hidden)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        from flashattn2 import flash_attn_func  # noqa: F401  (only checking it imports)
    except Exception as exc:
        print(f"warning: {OURS} does not import ({exc}); its columns will be n/a", file=sys.stderr)

    names = [OURS, *args.peers]
    print(
        f"{device_name}: {len(shapes)} shapes x {len(args.modes)} modes x {len(names)} implementations, "
        f"warmup {args.warmup:g} ms, rep {args.rep:g} ms (TFLOP/s; n/a = failed, skip = too big for naive)"
    )
    # First, before run_suite warms anything up: the first call of each combination compiles its kernels.
    first_call = measure_first_calls(
        shapes, args.modes, device, on_row=lambda entry: print(first_call_line(entry), flush=True)
    )
    print(stdout_header(names), flush=True)
    rows = run_suite(
        shapes,
        args.modes,
        args.peers,
        device,
        warmup_ms=args.warmup,
        rep_ms=args.rep,
        trials=args.trials,
        back_to_back=args.back_to_back,
        on_row=lambda row: print(stdout_line(row, names), flush=True),
    )

    memory = None
    if not args.no_memory:
        print(
            f"\npeak extra memory of fwd+bwd (MiB): {args.mem_dtype} batch {args.mem_batch}, "
            f"{args.mem_nheads} heads, hdim {args.mem_hdim}",
            flush=True,
        )
        memory = measure_memory(
            seqlens,
            args.peers,
            device,
            batch=args.mem_batch,
            nheads=args.mem_nheads,
            headdim=args.mem_hdim,
            dtype=args.mem_dtype,
            on_row=lambda row: print(memory_line(row), flush=True),
        )

    elapsed = time.perf_counter() - start
    meta = collect_meta(
        device_name,
        argv,
        extra={
            "total_tokens": args.total_tokens,
            "hidden": args.hidden,
            "warmup_ms": args.warmup,
            "rep_ms": args.rep,
            "trials": args.trials,
            "elapsed_s": round(elapsed, 1),
            "cold_cache": args.cold_cache,
        },
    )
    stem = args.tag or default_stem(device_name)
    path = write_json(Path(args.out_dir) / f"{stem}.json", meta, rows, memory, first_call)

    print()
    print(markdown_table(rows))
    print(f"wrote {path} (markdown: python benchmarks/report_bench.py {path}; PNG: python benchmarks/plot_bench.py "
          f"{path})")
    print(f"elapsed {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
