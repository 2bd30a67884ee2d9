"""python benchmarks/bench_context_parallel.py: context parallelism on the GPUs of one host.

    torchrun --nproc_per_node 2 benchmarks/bench_context_parallel.py --out-dir DIR
    python benchmarks/bench_context_parallel.py --nproc 2 --out-dir DIR      (starts its own processes)

Batch 1, bf16, head dim 128, 16 and 32 heads, causal and not, whole sequences of 64k-512k tokens: the time
of a forward + backward of ring attention (zigzag and contiguous shards) and of Ulysses on W GPUs (the
slowest rank's), of flash_attn_func on one GPU with the whole sequence (rank 0 alone, where it fits), the
scaling efficiency t1 / (W tW), and PyTorch's context_parallel with SDPA as a peer where it runs (its error
otherwise). "ring-comm" is the ring's messages of a forward + backward (the K/V shards' hops, there and in
the backward, and the gradients' hops) sent one after another with no attention: set against the ring's
time it shows how much of the communication the attention hides. Writes <out-dir>/<stem>_context_parallel
.json with the device, GPU count, versions, date and `nvidia-smi topo -m`; benchmarks/report_context_parallel.py
makes its markdown.

At 512k tokens one forward + backward on one GPU takes tens of seconds: split the sweep across commands
with --seqlens / --nheads / --causal where a command's time is limited. `--device cpu --seqlens 64
--nheads 2 --headdim 16` runs a tiny size over gloo through the Triton interpreter (a smoke test of the
script; its times measure the interpreter).
"""

import argparse
import datetime
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from flashattn2 import flash_attn_func
from flashattn2.bench import collect_meta, default_stem

# _Ring, _wait (private): ring-comm times the ring's own messages, so it sends them as the ring does
from flashattn2.distributed import _Ring, _wait, ring_flash_attn_func, ulysses_flash_attn_func

# NVLink multicast (NVLS) stays off: NCCL and symmetric memory read these when the process group starts
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

METHODS = {"ring-zigzag": (ring_flash_attn_func, "zigzag"), "ring-contiguous": (ring_flash_attn_func, "contiguous"),
           "ulysses": (ulysses_flash_attn_func, "zigzag")}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _loop_ms(step: Callable[[], None], device: torch.device, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        step()
    _sync(device)
    return (time.perf_counter() - start) * 1e3 / reps


def _slowest(ms: float | None, device: torch.device) -> float | None:
    """The slowest rank's time; None on every rank if one failed, so that every rank goes on alike."""
    t = torch.tensor([float("inf") if ms is None else ms], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return None if t.item() == float("inf") else t.item()


def _fwd_bwd(fn: Callable[..., torch.Tensor], leaves: list[torch.Tensor], dout: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        for x in leaves:
            x.grad = None
        fn(*leaves).backward(dout)

    return step


def _rand(shape, dtype, device, grad=False) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype, device=device).requires_grad_(grad)


def _ours(name, seqlen, nheads, causal, args, device) -> float | None:
    fn, layout = METHODS[name]
    shape = (1, seqlen // dist.get_world_size(), nheads, args.headdim)
    leaves = [_rand(shape, args.dtype, device, True) for _ in range(3)]
    step = _fwd_bwd(lambda q, k, v: fn(q, k, v, causal=causal, layout=layout), leaves, _rand(shape, args.dtype, device))
    return _loop_ms(step, device, args.warmup, args.reps)


def _ring_comm(seqlen, nheads, causal, args, device) -> float | None:
    ring = _Ring(None)
    shard = (1, seqlen // ring.world, nheads, args.headdim)
    kv = _rand((2, *shard), args.dtype, device)
    dkv = _rand((2, *shard), torch.float32, device)

    def hop(x: torch.Tensor) -> torch.Tensor:
        received, works = ring.pass_on(x)
        _wait(works)
        return received

    def step() -> None:
        nonlocal kv, dkv
        for _ in range(2 * (ring.world - 1)):  # the forward's and the backward's K/V hops
            kv = hop(kv)
        for _ in range(ring.world):  # the gradients' hops, the last one home
            dkv = hop(dkv)

    return _loop_ms(step, device, args.warmup, args.reps)


@functools.cache
def _mesh(device_type: str, world: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world,))


def _torch_cp(seqlen, nheads, causal, args, device) -> float | None:
    """PyTorch's context_parallel around SDPA (its default rotation and load balancing)."""
    from torch.distributed.tensor.experimental import context_parallel

    mesh = _mesh(device.type, dist.get_world_size())
    # the whole sequence in SDPA's layout; the context shards the buffers in place, so no grad until inside
    buffers = [_rand((1, nheads, seqlen, args.headdim), args.dtype, device) for _ in range(4)]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4, no_restore_buffers=set(buffers)):
        q, k, v, dout = buffers
        leaves = [x.requires_grad_() for x in (q, k, v)]
        step = _fwd_bwd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), leaves, dout)
        return _loop_ms(step, device, args.warmup, args.reps)


def _one_gpu(seqlen, nheads, causal, args, device) -> float | None:
    """flash_attn_func over the whole sequence on rank 0 (the others wait)."""
    if dist.get_rank() != 0:
        return None
    shape = (1, seqlen, nheads, args.headdim)
    leaves = [_rand(shape, args.dtype, device, True) for _ in range(3)]
    step = _fwd_bwd(lambda q, k, v: flash_attn_func(q, k, v, causal=causal), leaves, _rand(shape, args.dtype, device))
    return _loop_ms(step, device, args.warmup, args.reps)


def _attempt(fn, seqlen, nheads, causal, args, device) -> tuple[float | None, str | None]:
    """(ms, None), or (None, the error): an OOM at 512k, an API that moved."""
    try:
        return fn(seqlen, nheads, causal, args, device), None
    except Exception as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        return None, f"{type(exc).__name__}: {first_line}"[:300]
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def measure(seqlen: int, nheads: int, causal: bool, args, device: torch.device) -> dict:
    world = dist.get_world_size()
    row = {"seqlen": seqlen, "nheads": nheads, "causal": causal, "ms": {}, "errors": {}}
    runs = {name: functools.partial(_ours, name) for name in METHODS}
    runs["ring-comm"] = _ring_comm
    if not args.no_torch_cp:
        runs["torch-cp"] = _torch_cp
    for name, fn in runs.items():
        ms, error = _attempt(fn, seqlen, nheads, causal, args, device)
        row["ms"][name] = _slowest(ms, device)
        if error:
            row["errors"][name] = error
    ms, error = _attempt(_one_gpu, seqlen, nheads, causal, args, device)
    dist.barrier()
    row["ms"]["1-gpu"] = ms
    if error:
        row["errors"]["1-gpu"] = error
    one = row["ms"]["1-gpu"]
    row["efficiency"] = {name: one / (world * row["ms"][name]) for name in (*METHODS, "torch-cp")
                         if one and row["ms"].get(name)}
    return row


def _topology() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _worker(rank: int, args: argparse.Namespace, store: str | None) -> None:
    world = args.nproc
    if store is None:  # torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=20),
                            init_method="env://" if store is None else f"file://{store}", rank=rank,
                            world_size=world, **({"device_id": device} if device.type == "cuda" else {}))
    try:
        rows = []
        for nheads in args.nheads:
            for causal in args.causal:
                for seqlen in args.seqlens:
                    row = measure(seqlen, nheads, causal, args, device)
                    rows.append(row)
                    if rank == 0:
                        print(json.dumps(row), flush=True)
        if rank == 0:
            _write(args, rows, world, device)
    finally:
        dist.destroy_process_group()


def _write(args, rows: list[dict], world: int, device: torch.device) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    meta = collect_meta(name, args.argv, prog="python benchmarks/bench_context_parallel.py", extra={
        "world_size": world, "gpu_count": torch.cuda.device_count() if device.type == "cuda" else 0,
        "dtype": str(args.dtype).removeprefix("torch."), "headdim": args.headdim, "warmup": args.warmup,
        "reps": args.reps, "topology": _topology()})
    result = {"meta": meta, "rows": rows}
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = (args.tag or default_stem(name)) + "_context_parallel"
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out_dir / stem}.json (markdown: python benchmarks/report_context_parallel.py on it)", flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_context_parallel.py", description=__doc__.split("\n")[0])
    p.add_argument("--out-dir", default="benchmarks/results")
    p.add_argument("--tag", help="result file stem (default YYYY-MM-DD_<device>)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--nproc", type=int, help="processes to start without torchrun (default: the GPUs, or 2 on cpu)")
    p.add_argument("--seqlens", type=int, nargs="+", default=[65536, 131072, 262144, 524288])
    p.add_argument("--nheads", type=int, nargs="+", default=[16, 32])
    p.add_argument("--causal", type=int, nargs="+", choices=(0, 1), default=[0, 1])
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--warmup", type=int, default=1, help="untimed fwd+bwd steps per measurement (1)")
    p.add_argument("--reps", type=int, default=3, help="timed fwd+bwd steps per measurement (3)")
    p.add_argument("--no-torch-cp", action="store_true", help="skip PyTorch's context_parallel")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv, args.causal = argv, [bool(c) for c in args.causal]
    args.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: `--device cpu` runs a smoke test through the Triton interpreter", file=sys.stderr)
        return 2
    if "RANK" in os.environ:  # under torchrun
        _worker(0, args, None)
        return 0
    args.nproc = args.nproc or (torch.cuda.device_count() if args.device == "cuda" else 2)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read when the workers import flashattn2
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.spawn(_worker, args=(args, str(Path(tmp) / "store")), nprocs=args.nproc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
