"""Tile sizes, warps and pipeline stages, chosen per GPU architecture and head dim.

A fixed table rather than run-time autotuning: the first call of a new shape compiles once and never
stalls on a search, and the interpreter (which cannot autotune) gets small tiles that still cross
several tile boundaries on the test shapes. The Hopper rows come from scripts/sweep_configs.py runs,
recorded in benchmarks/NOTES.md.
"""

from dataclasses import dataclass

import torch

from ..common import INTERPRET, is_hopper_family


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # stream K and V through tensor descriptors where the inputs allow (dense, 16-byte aligned)
    use_tma: bool = False
    # calls without a left window edge: the key tiles as one loop, the diagonal and the keys' end masked by a branch,
    # so that the key pipeline fills once an item instead of once for the unmasked tiles and once for the masked
    one_loop: bool = False


@dataclass(frozen=True)
class BwdConfig:
    # dK/dV kernel: BLOCK_N keys stay resident while BLOCK_M query tiles stream past
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # dQ kernel (deterministic path, or the default when atomics lose): BLOCK_M queries resident
    dq_block_m: int
    dq_block_n: int
    dq_num_warps: int
    dq_num_stages: int
    # default (non-deterministic) dQ strategy: fp32 atomics from the dK/dV kernel, or the dQ kernel
    atomic_dq: bool
    # stream Q, dO (dK/dV kernel) and K, V (dQ kernel) through tensor descriptors where the inputs allow
    use_tma: bool = False


# Descriptors on under the interpreter so that CPU runs cover both load paths: it reads fp16 through
# them and keeps pointers for bf16 (tma.tma_usable).
_INTERPRET_FWD = FwdConfig(32, 16, 4, 1, True)
# atomics on under the interpreter so that CPU runs cover both dQ paths (deterministic=True takes the other)
_INTERPRET_BWD = BwdConfig(16, 32, 4, 1, 32, 16, 4, 1, True, True)

# Hopper (sm_90), from the 2026-11-21 sweep on an H100 (bf16, seqlen 4096, 16k tokens, hidden 2048;
# benchmarks/results/2026-11-21_sweep_h100.json). causal -> [(max padded head dim, config)], first fit.
# CI compiles every row of the three Hopper forward tables for sm_90 (tests/test_host.py: wgmma, cp.async, no spills)
_HOPPER_FWD: dict[bool, list[tuple[int, FwdConfig]]] = {
    False: [(64, FwdConfig(64, 64, 4, 3)), (128, FwdConfig(64, 64, 4, 3)), (256, FwdConfig(128, 64, 8, 2))],
    True: [(64, FwdConfig(128, 64, 8, 3)), (128, FwdConfig(64, 64, 4, 3)),
           (256, FwdConfig(128, 64, 8, 2, one_loop=True))],
}
# one_loop (H200, 2026-11-29, five alternating rounds, time over two loops, causal softcap 30): d256 0.967 at 512,
# 0.966 at 2k; d128 0.951 at 512 but 1.021 at 2k, d64 (128, 64, 8, 3) 1.025 at 8k: those keep two loops
# Calls of at most this many query rows, by (fp8, causal) -> [(max padded head dim, max rows, config)], first fit.
# bf16 causal: d64's 64-row tiles of 4 warps (H200, 2026-11-28, two sweeps against (128, 64, 8, 3): 512 rows 0.150 /
# 0.150 against 0.167 / 0.167 ms, 1k 0.223 / 0.225 against 0.239 / 0.240; benchmarks/results/
# 2026-11-28_s21_h200_sweep_fwd_*). Interleaved A/Bs (scripts/ab_triton_fwd.py, 2026-11-28_s22_ab/06-09), time over
# (128, 64, 8, 3): 1k 0.931, 2k 0.971 / 0.937 / 0.960, 4k 0.963 / 0.974 / 0.984. From 8k rows auto runs the Gluon
# forward (one-shot sweeps read 8k slower). one_loop (H200, 2026-11-29, six alternating rounds, time over two
# loops): 512 0.926, 768 0.951, 1k 0.956, 2k 0.988
# FP8 causal, one loop each, time over (128, 128, 8, 3) (H200, 2026-11-29, five alternating rounds): d64 (64, 64,
# 4, 3) 0.696 / 0.755 / 0.795 at 512 / 1k / 1.5k; d128 (64, 64, 4, 3) 0.782 / 0.836 / 0.875 at 512 / 1k / 2k; d256
# (64, 64, 4, 2) 0.80 / 0.78 at 512 / 1k over (128, 64, 8, 2)
# FP8 non-causal (H200, 2026-11-29, five alternating rounds, results/2026-11-29_s29_ab/01-02): d64 (64, 64, 4, 3)
# 0.97 of (64, 128, 4, 3) at 512, level at 1k; d128 (64, 64, 4, 3) 0.806 / 0.860 of (128, 128, 8, 3) at 512 / 1k,
# against (64, 128, 4, 3)'s 0.870 / 0.862
_HOPPER_FWD_SHORT: dict[tuple[bool, bool], list[tuple[int, int, FwdConfig]]] = {
    (False, True): [(64, 4096, FwdConfig(64, 64, 4, 3, one_loop=True))],
    (True, True): [(64, 1024, FwdConfig(64, 64, 4, 3, one_loop=True)),
                   (128, 2048, FwdConfig(64, 64, 4, 3, one_loop=True)),
                   (256, 1024, FwdConfig(64, 64, 4, 2, one_loop=True))],
    (True, False): [(64, 512, FwdConfig(64, 64, 4, 3)), (128, 1024, FwdConfig(64, 64, 4, 3))],
}
# The separate dQ kernel beat fp32 atomics at every head dim (by 7% to 30%; in the second sweep also
# against bulk reduce-adds through a descriptor), so Hopper uses it by default. Tensor descriptors
# (the last field) won at hdim 128 and 256 and lost at 64 (2026-11-21 second sweep, NOTES.md). The d128
# dQ tile 128 x 64, 8 warps, 3 stages (2026-11-24): +4-12% over 128 x 32 on dense and causal shapes, 1.5-1.8x on
# sliding windows.
_HOPPER_BWD: dict[bool, list[tuple[int, BwdConfig]]] = {
    False: [(64, BwdConfig(32, 128, 4, 3, 128, 64, 8, 2, False)),
            (128, BwdConfig(64, 64, 4, 2, 128, 64, 8, 3, False, True)),
            (256, BwdConfig(64, 64, 8, 2, 64, 32, 4, 2, False, True))],
    True: [(64, BwdConfig(32, 128, 4, 3, 64, 64, 4, 3, False)),
           (128, BwdConfig(64, 64, 4, 2, 128, 64, 8, 3, False, True)),
           (256, BwdConfig(64, 64, 8, 2, 64, 32, 4, 2, False, True))],
}
# FP8 (e4m3) forward on Hopper: operands half as wide, so longer key tiles fit (benchmarks/bench_fp8.py
# --sweep picks these). d64 causal: 64-row tiles as one loop, time over (128, 128, 8, 3) as one loop (which itself
# took 0.936 / 0.957 of two loops at 512 / 1k): 0.80 / 0.82 / 0.83 at 2k / 4k / 8k (H200, 2026-11-29). d64
# non-causal: (64, 128, 4, 3) 0.75 / 0.79 / 0.80 / 0.82 / 0.83 / 0.83 of (128, 128, 8, 3) at 512-16k (H200,
# 2026-11-29; one loop 0.99 / 0.98 at 512 / 1k, 1.01-1.04 from 4k). d128 non-causal (64, 128, 4, 3) 0.87 / 0.90 / 0.90
# of (128, 128, 8, 3) at 2k / 4k / 16k; d256 non-causal (64, 64, 4, 3) 0.77 / 0.73 / 0.72 / 0.76 / 0.75 of (128, 64,
# 8, 2) at 512 / 1k / 2k / 4k / 16k (H200, 2026-11-29, results/2026-11-29_s29_ab/02-03). Auto runs dense d128 / d256
# non-causal FP8 calls on Gluon: these two rows serve packed batches and forced calls.
_HOPPER_FWD_FP8: dict[bool, list[tuple[int, FwdConfig]]] = {
    False: [(64, FwdConfig(64, 128, 4, 3)), (128, FwdConfig(64, 128, 4, 3)), (256, FwdConfig(64, 64, 4, 3))],
    True: [(64, FwdConfig(64, 128, 4, 3, one_loop=True)), (128, FwdConfig(128, 128, 8, 3)),
           (256, FwdConfig(128, 64, 8, 2))],
}
# Other GPUs: modest tiles that fit in Ampere-class shared memory.
_GENERIC_FWD: list[tuple[int, FwdConfig]] = [
    (64, FwdConfig(128, 64, 4, 2)), (128, FwdConfig(128, 32, 4, 2)), (256, FwdConfig(64, 32, 4, 1)),
]
_GENERIC_BWD: list[tuple[int, BwdConfig]] = [
    (64, BwdConfig(32, 64, 4, 2, 64, 32, 4, 2, False)),
    (128, BwdConfig(32, 64, 4, 2, 64, 32, 4, 2, False)),
    (256, BwdConfig(16, 32, 4, 1, 32, 16, 4, 1, False)),
]


def _pick(table, block_d: int):
    for bound, cfg in table:
        if block_d <= bound:
            return cfg
    raise ValueError(f"no tile configuration for padded head dim {block_d}")


def fwd_config(block_d: int, causal: bool, device: torch.device, fp8: bool = False,
               rows: int | None = None) -> FwdConfig:
    """rows: the call's (longest) query sequence, which picks the short-call tiles."""
    if INTERPRET:
        return _INTERPRET_FWD
    if is_hopper_family(device):
        if rows is not None:
            # the first row whose head dim bound fits, if the call is short enough for it
            fit = next((row for row in _HOPPER_FWD_SHORT.get((fp8, causal), ()) if block_d <= row[0]), None)
            if fit is not None and rows <= fit[1]:
                return fit[2]
        return _pick((_HOPPER_FWD_FP8 if fp8 else _HOPPER_FWD)[causal], block_d)
    return _pick(_GENERIC_FWD, block_d)


def bwd_config(block_d: int, causal: bool, device: torch.device) -> BwdConfig:
    if INTERPRET:
        return _INTERPRET_BWD
    if is_hopper_family(device):
        return _pick(_HOPPER_BWD[causal], block_d)
    return _pick(_GENERIC_BWD, block_d)
