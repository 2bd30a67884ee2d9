"""Context parallelism (flashattn2.distributed): ring and Ulysses attention over sequence shards in 2 and 3
CPU processes (gloo), gathered and checked against one-process attention in float64 by the pass rule;
bad input raising on every rank; the layouts' arithmetic and the ring's choice of blocks without processes;
the same comparison on 2 GPUs (NCCL) where there are two.

Starting the processes is the expensive part (torch and the interpreter's imports), so each process
group runs several cases."""

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashattn2
from flashattn2 import flash_attn_func
from flashattn2.distributed import (
    _cpu_groups,
    _from_natural,
    _local_shard,
    _to_natural,
    rank_chunks,
    ring_block,
    ring_flash_attn_func,
    ring_flash_attn_varlen_func,
    shard_sequence,
    ulysses_flash_attn_func,
    unshard_sequence,
)
from helpers import ON_GPU, check_attention, randn

# gloo process groups over CPU tensors, whose kernels only the interpreter runs: CI's tests; a GPU machine runs
# test_two_gpus_nccl (the interpreter is off there, and the kernels refuse CPU tensors)
cpu_processes = pytest.mark.skipif(ON_GPU, reason="CPU tensors through the Triton interpreter (CI)")
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
TEST_TIMEOUT_S = 150  # a hung process group fails the test instead of the run
METHODS = {"ring": ring_flash_attn_func, "ulysses": ulysses_flash_attn_func}


class Case(NamedTuple):
    method: str  # "ring" or "ulysses"
    layout: str
    causal: bool
    batch: int
    seqlen: int  # the whole sequence's
    nheads: int
    nheads_k: int
    headdim: int
    options: tuple = ()  # (name, value) pairs for the call and the reference; "alibi" draws slopes


# ----------------------------------------------------------------------------------------------
# process groups


def _entry(rank: int, world: int, store: str, backend: str, fn, args) -> None:
    torch.set_num_threads(1)  # 2 or 3 processes share the CI machine's 2 cores
    if backend == "nccl":
        # NVLink multicast stays off (on shared machines it can take the host's GPUs out of service)
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path, world: int, fn, *args, backend: str = "gloo") -> None:
    """fn(rank, world, *args) in `world` processes; a worker's exception fails the test, and so does a hang."""
    context = mp.spawn(_entry, args=(world, str(tmp_path / "store"), backend, fn, args), nprocs=world, join=False)
    deadline = time.monotonic() + TEST_TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {world} processes did not finish in {TEST_TIMEOUT_S} s")


# ----------------------------------------------------------------------------------------------
# numerics: the gathered output, lse and gradients against the whole sequence's attention


def _inputs(case: Case, dtype: torch.dtype, device: str):
    """q, k, v, dout of the whole sequence and the call's options: the same on every rank (fixed seed, CPU)."""
    g = torch.Generator().manual_seed(case.seqlen * 101 + case.nheads * 7 + case.nheads_k)
    heads = (case.nheads, case.nheads_k, case.nheads_k, case.nheads)
    q, k, v, dout = (randn(case.batch, case.seqlen, h, case.headdim, dtype=dtype, device="cpu", generator=g)
                     .to(device) for h in heads)
    options = dict(case.options)
    if options.pop("alibi", False):
        options["alibi_slopes"] = torch.rand(case.nheads, generator=g).to(device)
    return q, k, v, dout, options


def _check_case(case: Case, dtype: torch.dtype, device: str) -> None:
    q, k, v, dout, options = _inputs(case, dtype, device)
    layout = case.layout
    shards = [shard_sequence(x, layout=layout).requires_grad_() for x in (q, k, v)]
    out, lse, _ = METHODS[case.method](*shards, causal=case.causal, layout=layout, return_attn_probs=True,
                                       **options)
    whole = unshard_sequence(out, layout=layout)
    whole.backward(dout)  # through unshard_sequence's backward: each rank's part of dout
    grads = [unshard_sequence(x.grad, layout=layout) for x in shards]
    try:
        check_attention(q, k, v, whole.detach(), unshard_sequence(lse, dim=2, layout=layout), grads, dout,
                        causal=case.causal, **options)
    except AssertionError as exc:
        raise AssertionError(f"{case}: {exc}") from None


def _check_cases(rank: int, world: int, cases: list[Case], dtype: torch.dtype, device: str) -> None:
    for case in cases:
        _check_case(case, dtype, f"cuda:{rank}" if device == "cuda" else device)


# by world size: ring (zigzag, contiguous; causal or not; GQA; odd chunks; softcap, a scale) and Ulysses (GQA,
# kv heads fewer than ranks, ALiBi with a window)
RANK_CASES = {
    2: [
        Case("ring", "zigzag", True, 2, 28, 4, 2, 32),  # chunks of 7
        Case("ring", "zigzag", False, 1, 24, 2, 2, 16, (("softcap", 5.0),)),
        Case("ring", "contiguous", True, 1, 26, 2, 1, 16),  # shards of 13
        Case("ring", "contiguous", False, 1, 24, 2, 1, 16, (("softmax_scale", 0.3),)),
        Case("ulysses", "zigzag", True, 2, 28, 4, 2, 32),
        Case("ulysses", "contiguous", False, 1, 26, 4, 1, 16, (("window_size", (6, 3)), ("alibi", True))),
    ],
    3: [
        Case("ring", "zigzag", True, 1, 30, 3, 1, 16),  # chunks of 5
        Case("ring", "contiguous", True, 1, 27, 2, 2, 16),
        Case("ulysses", "zigzag", True, 1, 30, 3, 1, 16),
    ],
    4: [
        Case("ring", "zigzag", True, 1, 40, 2, 1, 16),  # chunks of 5
        Case("ring", "contiguous", False, 1, 20, 2, 2, 16),
        Case("ulysses", "zigzag", True, 1, 24, 4, 2, 16),  # 2 kv heads for 4 ranks: copies
    ],
    8: [
        Case("ring", "zigzag", True, 1, 48, 2, 1, 16),  # chunks of 3
        Case("ring", "contiguous", True, 1, 24, 2, 2, 16),
        Case("ulysses", "zigzag", True, 1, 32, 8, 2, 16),
    ],
}


@cpu_processes
@pytest.mark.parametrize("world", sorted(RANK_CASES))
def test_ranks(tmp_path, world):
    _spawn(tmp_path, world, _check_cases, RANK_CASES[world], torch.float16, "cpu")


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2+ CUDA GPUs")
def test_two_gpus_nccl(tmp_path):
    cases = [
        Case("ring", "zigzag", True, 1, 4096, 8, 8, 128),
        Case("ring", "zigzag", False, 1, 4096, 8, 2, 128),
        Case("ring", "contiguous", True, 1, 4096, 8, 8, 128),
        Case("ulysses", "zigzag", True, 1, 4096, 8, 2, 128),
    ]
    _spawn(tmp_path, 2, _check_cases, cases, torch.bfloat16, "cuda", backend="nccl")


# ----------------------------------------------------------------------------------------------
# bad input: the same named error on every rank, and the group still usable afterwards


def _shards(batch, seqlen, nheads, nheads_k=None, dtype=torch.float16):
    g = torch.Generator().manual_seed(seqlen)
    return [randn(batch, seqlen, h, 16, dtype=dtype, device="cpu", generator=g)
            for h in (nheads, nheads_k or nheads, nheads_k or nheads)]


def _bad_inputs(rank: int, world: int) -> None:
    for fn in (ring_flash_attn_func, ulysses_flash_attn_func):
        with pytest.raises(ValueError, match=r"shards differ.*rank 0: q \(1, 12, 2, 16\).*rank 1: q \(1, 14, 2"):
            fn(*_shards(1, 12 + 2 * rank, 2))
        with pytest.raises(ValueError, match="shards differ.*float16.*bfloat16"):
            fn(*_shards(1, 12, 2, dtype=torch.bfloat16 if rank else torch.float16))
        with pytest.raises(ValueError, match="must be even, got local_seqlen 7"):
            fn(*_shards(1, 7, 2))
        with pytest.raises(TypeError, match="float16 and bfloat16"):
            fn(*_shards(1, 12, 2, dtype=torch.float32))
        with pytest.raises(ValueError, match="layout must be one of"):
            fn(*_shards(1, 12, 2), layout="striped")
    with pytest.raises(ValueError, match="nheads \\(3\\) must be divisible by 2"):
        ulysses_flash_attn_func(*_shards(1, 12, 3))
    with pytest.raises(ValueError, match="nheads_k \\(3\\) too"):
        ulysses_flash_attn_func(*_shards(1, 12, 6, 3))
    with pytest.raises(NotImplementedError, match="window_size.*ulysses_flash_attn_func"):
        ring_flash_attn_func(*_shards(1, 12, 2), window_size=(4, 0))
    with pytest.raises(NotImplementedError, match="alibi_slopes.*ulysses_flash_attn_func"):
        ring_flash_attn_func(*_shards(1, 12, 2), alibi_slopes=torch.ones(2))
    with pytest.raises(ValueError, match="length 10 does not shard over 2 ranks in the 'zigzag' layout"):
        shard_sequence(torch.zeros(1, 10, 2, 16))
    with pytest.raises(ValueError, match="unshard_sequence: the ranks' shards differ"):
        unshard_sequence(torch.zeros(1, 4 + rank, 2, 16))
    # nothing is left in flight: the next calls work, and the plain output is return_attn_probs's
    for fn in (ring_flash_attn_func, ulysses_flash_attn_func):
        q, k, v = _shards(1, 12, 2)
        out, _, _ = fn(q, k, v, causal=True, return_attn_probs=True)
        assert torch.equal(fn(q, k, v, causal=True), out)
    # a group that takes no CPU tensors (NCCL) has the check run on a gloo group of its ranks, made once
    get_backend, dist.get_backend = dist.get_backend, lambda group=None: "nccl"
    try:
        for _ in range(2):
            with pytest.raises(ValueError, match=r"shards differ.*rank 1: q \(1, 14, 2"):
                ring_flash_attn_func(*_shards(1, 12 + 2 * rank, 2))
        assert list(_cpu_groups) == [dist.group.WORLD]
        assert dist.get_process_group_ranks(_cpu_groups[dist.group.WORLD]) == list(range(world))
    finally:
        dist.get_backend = get_backend


@cpu_processes
def test_bad_input_raises_on_every_rank(tmp_path):
    _spawn(tmp_path, 2, _bad_inputs)


@cpu_processes
def test_one_rank_is_flash_attn_func(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        q, k, v = _shards(1, 10, 2)
        for fn in (ring_flash_attn_func, ulysses_flash_attn_func):
            assert torch.equal(fn(q, k, v, causal=True), flash_attn_func(q, k, v, causal=True))
        x = torch.arange(10.0).view(1, 10)
        assert torch.equal(unshard_sequence(shard_sequence(x)), x)
    finally:
        dist.destroy_process_group()


def test_ring_varlen_is_not_implemented():
    with pytest.raises(NotImplementedError, match="ring_flash_attn_func"):
        ring_flash_attn_varlen_func(None, None, None, None, None, 8, 8)


# ----------------------------------------------------------------------------------------------
# layouts and the ring's blocks, without processes


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_round_trip(world, layout):
    seqlen = 2 * world * 3
    x = torch.arange(2 * seqlen).view(2, seqlen)
    shards = [_local_shard(x, 1, r, world, layout) for r in range(world)]
    assert torch.equal(_to_natural(torch.cat(shards, 1), 1, world, layout), x)
    assert torch.equal(_from_natural(x, 1, world, layout), torch.cat(shards, 1))


def test_zigzag_shards():
    x = torch.arange(8)
    assert [_local_shard(x, 0, r, 2, "zigzag").tolist() for r in range(2)] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert [_local_shard(x, 0, r, 2, "contiguous").tolist() for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert rank_chunks(1, 4, "zigzag") == (1, 6) and rank_chunks(1, 4, "contiguous") == (1,)


def _positions(rank: int, world: int, layout: str, seqlen: int) -> list[int]:
    """The global positions of rank's shard of length seqlen."""
    size = seqlen // len(rank_chunks(rank, world, layout))
    return [c * size + i for c in rank_chunks(rank, world, layout) for i in range(size)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_blocks_cover_the_mask_once(world, layout, causal):
    """Over all the ring's steps, every (query, key) pair that the mask keeps is computed exactly once, and no
    other pair; zigzag's causal steps after the first are all the same size."""
    seqlen = 6
    for rank in range(world):
        seen, sizes = [], []
        for source in range(world):
            block = ring_block(rank, source, world, layout, causal, seqlen)
            if block is None:
                continue
            rows, keys, block_causal = block
            q_pos = _positions(rank, world, layout, seqlen)[rows]
            k_pos = _positions(source, world, layout, seqlen)[keys]
            offset = len(k_pos) - len(q_pos)  # causal blocks are aligned bottom-right, like flash_attn_func
            seen += [(qp, kp) for i, qp in enumerate(q_pos) for j, kp in enumerate(k_pos)
                     if not block_causal or j <= i + offset]
            if source != rank:
                sizes.append(len(q_pos) * len(k_pos))
        mine = _positions(rank, world, layout, seqlen)
        expected = [(i, j) for i in mine for j in range(world * seqlen) if not causal or j <= i]
        assert sorted(seen) == sorted(expected), (rank, layout, causal)
        if layout == "zigzag":
            assert len(set(sizes)) <= 1


def test_import_flashattn2_leaves_distributed_out():
    code = "import sys, flashattn2; print('flashattn2.distributed' in sys.modules)"
    src = str(Path(flashattn2.__file__).parents[1])  # this checkout's package, whatever is installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"



@cpu_processes
def test_context_parallel_benchmark_runs_on_cpu(tmp_path):
    """The benchmark script end to end at a tiny size (2 gloo processes, the interpreter): every method and the
    single-process baseline timed, PyTorch's peer timed or its error recorded, JSON written; then the report
    script's markdown."""
    benchmarks = Path(__file__).parents[1] / "benchmarks"
    argv = ["--device", "cpu", "--seqlens", "32", "--nheads", "2", "--headdim", "16", "--causal", "1",
            "--warmup", "0", "--reps", "1", "--out-dir", str(tmp_path), "--tag", "smoke"]
    src = str(Path(flashattn2.__file__).parents[1])  # this checkout's package, whatever is installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    # a script, run as its users run it (its spawned workers re-import it as __main__'s file)
    run = subprocess.run([sys.executable, str(benchmarks / "bench_context_parallel.py"), *argv],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "smoke_context_parallel.json").read_text())
    (row,) = result["rows"]
    for name in ("ring-zigzag", "ring-contiguous", "ulysses", "ring-comm", "1-gpu"):
        assert row["ms"][name] > 0, (name, row)
    assert (row["ms"]["torch-cp"] is None) == ("torch-cp" in row["errors"])
    assert result["meta"]["world_size"] == 2
    script = benchmarks / "report_context_parallel.py"
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "smoke_context_parallel.json")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "| 2 | True | 32 |" in (tmp_path / "smoke_context_parallel.md").read_text()
