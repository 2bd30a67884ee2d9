"""Tile sizes, warps and pipeline stages, chosen per GPU architecture and head dim.

A fixed table rather than run-time autotuning: the first call of a new shape compiles once and never
stalls on a search, and the interpreter (which cannot autotune) gets small tiles that still cross
several tile boundaries on the test shapes. The Hopper rows come from scripts/sweep_configs.py runs
recorded in benchmarks/NOTES.md.
"""

from dataclasses import dataclass

import torch

from .common import INTERPRET


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


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


_INTERPRET_FWD = FwdConfig(32, 16, 4, 1)
_INTERPRET_BWD = BwdConfig(16, 32, 4, 1, 32, 16, 4, 1, True)

# (max padded head dim, causal) -> config; the first row whose head dim bound fits is taken.
_HOPPER_FWD: dict[bool, list[tuple[int, FwdConfig]]] = {
    False: [(64, FwdConfig(128, 64, 4, 3)), (128, FwdConfig(128, 64, 8, 3)), (256, FwdConfig(64, 64, 4, 2))],
    True: [(64, FwdConfig(128, 64, 4, 3)), (128, FwdConfig(128, 64, 8, 3)), (256, FwdConfig(64, 64, 4, 2))],
}
_HOPPER_BWD: list[tuple[int, BwdConfig]] = [
    (64, BwdConfig(64, 128, 8, 2, 128, 64, 8, 2, True)),
    (128, BwdConfig(64, 128, 8, 2, 128, 64, 8, 2, True)),
    (256, BwdConfig(32, 64, 8, 1, 64, 32, 8, 1, True)),
]
# Other GPUs: modest tiles that fit in Ampere-class shared memory.
_GENERIC_FWD: list[tuple[int, FwdConfig]] = [
    (64, FwdConfig(128, 64, 4, 2)), (128, FwdConfig(128, 32, 4, 2)), (256, FwdConfig(64, 32, 4, 1)),
]
_GENERIC_BWD: list[tuple[int, BwdConfig]] = [
    (64, BwdConfig(32, 64, 4, 2, 64, 32, 4, 2, True)),
    (128, BwdConfig(32, 64, 4, 2, 64, 32, 4, 2, True)),
    (256, BwdConfig(16, 32, 4, 1, 32, 16, 4, 1, True)),
]


def _pick(table, block_d: int):
    for bound, cfg in table:
        if block_d <= bound:
            return cfg
    raise ValueError(f"no tile configuration for padded head dim {block_d}")


def _is_hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def fwd_config(block_d: int, causal: bool, device: torch.device) -> FwdConfig:
    if INTERPRET:
        return _INTERPRET_FWD
    if _is_hopper(device):
        return _pick(_HOPPER_FWD[causal], block_d)
    return _pick(_GENERIC_FWD, block_d)


def bwd_config(block_d: int, causal: bool, device: torch.device) -> BwdConfig:
    if INTERPRET:
        return _INTERPRET_BWD
    if _is_hopper(device):
        return _pick(_HOPPER_BWD, block_d)
    return _pick(_GENERIC_BWD, block_d)
