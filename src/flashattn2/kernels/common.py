"""Helpers shared by the forward and backward kernels: interpreter detection, tile loads, matmuls."""

import functools
import os

import torch
import triton
import triton.language as tl

# Triton picks the interpreter when a kernel is decorated, so this is read once, at import.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"


# Tests set this so that every output starts as NaN: an element a kernel never writes then fails.
POISON_OUTPUTS: bool = os.environ.get("FLASHATTN2_POISON_OUTPUTS", "0") == "1"


def empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate a kernel output (NaN-filled when POISON_OUTPUTS is on)."""
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


# Row offsets inside one sequence (row index x row stride) are 32-bit unless they can reach this
ROW_OFFSET_LIMIT = 2**31


def long_rows(row_dim: int, *tensors) -> bool:
    """True when a row offset inside one sequence can reach 2**31 elements, in these tensors or in contiguous
    outputs of their shape: the kernels then compute row offsets in 64 bits (their LONG_ROWS flag; the
    32-bit code of every other shape is unchanged)."""
    for x in tensors:
        if x is None:
            continue
        rows, inner = x.shape[row_dim], 1
        for size in x.shape[row_dim + 1:]:
            inner *= size
        if rows * max(x.stride(row_dim), inner) >= ROW_OFFSET_LIMIT:
            return True
    return False


def padded_head_dim(head_dim: int) -> int:
    """Tiles span a power of two >= 16 columns (tl.dot needs K >= 16); extra columns are masked."""
    return max(16, 1 << (head_dim - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    # triton.cdiv is a constexpr function since 3.9, with a slow Python call path
    return -(-a // b)


@functools.cache
def capability(device_index: int) -> tuple[int, int]:
    """The compute capability of a CUDA device (cached: torch asks the driver on every call)."""
    return torch.cuda.get_device_capability(device_index)


# What the kernel families need of a GPU, decided here alone. The Gluon kernels are compiled for sm_90a (wgmma,
# setmaxnreg), which runs on compute capability 9.0 only; TMA descriptors exist from 9.0 on; e4m3 tensor cores
# from 8.9 on. The portable kernels' Hopper tiles go with the 9.x family.
SM90A = (9, 0)
TMA_MIN = (9, 0)
FP8_MIN = (8, 9)


def _index(device: torch.device) -> int:
    # torch.device("cuda") names the current device
    return device.index if device.index is not None else torch.cuda.current_device()


def gpu_arch(x: torch.Tensor | torch.device) -> tuple[int, int] | None:
    """(major, minor) compute capability of the CUDA device of a tensor or device; None off CUDA."""
    if isinstance(x, torch.Tensor):
        return capability(x.get_device()) if x.is_cuda else None
    return capability(_index(x)) if x.type == "cuda" else None


def runs_sm90a(x: torch.Tensor | torch.device) -> bool:
    """The Gluon (sm_90a) kernels can run here."""
    return gpu_arch(x) == SM90A


def has_tma(x: torch.Tensor | torch.device) -> bool:
    arch = gpu_arch(x)
    return arch is not None and arch >= TMA_MIN


def is_hopper_family(x: torch.Tensor | torch.device) -> bool:
    """Compute capability 9.x: the portable kernels' Hopper tile tables."""
    arch = gpu_arch(x)
    return arch is not None and arch[0] == SM90A[0]


@functools.cache
def _l2_bytes(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).L2_cache_size


def l2_section(bytes_per_head: int, device: torch.device, share: int = 1) -> int:
    """How many (batch, head) pairs, each streaming `bytes_per_head` bytes, fit together in 1/share of the GPU's
    L2: a power of 2, at least 1 (FlashAttention-3/4's swizzle). The section of device/tile_order.sectioned_item."""
    fit = _l2_bytes(_index(device)) // share // max(bytes_per_head, 1)
    return 1 << (max(fit, 1).bit_length() - 1)


LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def mma(a, b, acc, INTERPRET: tl.constexpr):
    """acc + a @ b with fp32 accumulation (acc may be None: a @ b).

    The interpreter computes a bf16 dot wrongly, so under it the operands are widened to fp32 after
    they were rounded to the input dtype, which keeps the GPU's rounding points.
    """
    if INTERPRET:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def round_to(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """Round fp32 x to dtype to nearest-even, as the GPU does.

    The interpreter truncates fp32 -> bf16, which biases every rounded P, dS and output, so under it
    the rounding is done on the bits.
    """
    if INTERPRET and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        y = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif INTERPRET and dtype == tl.float8e4nv:
        # the interpreter's fp32 -> e4m3 is wrong for some values: round to e4m3's grid on the bits (3 mantissa
        # bits; 2**-9 steps below 2**-6) and keep fp32, which mma widens to under the interpreter anyway
        bits = x.to(tl.uint32, bitcast=True)
        y = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
        y = tl.where(tl.abs(x) < 0.015625, tl.floor(x * 512.0 + 0.5) / 512.0, y)
    else:
        y = x.to(dtype)
    return y


@triton.jit
def load_rows(ptrs, rows, n_rows, cols, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              CHECK_ROWS: tl.constexpr):
    """Load a (rows, BLOCK_D) tile; bounds are checked only where a constexpr says they can be crossed."""
    if CHECK_ROWS:
        mask = rows[:, None] < n_rows
        if HEAD_DIM != BLOCK_D:
            mask = mask & (cols[None, :] < HEAD_DIM)
        x = tl.load(ptrs, mask=mask, other=0.0)
    elif HEAD_DIM != BLOCK_D:
        x = tl.load(ptrs, mask=cols[None, :] < HEAD_DIM, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def store_rows(ptrs, x, rows, n_rows, cols, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store a (rows, BLOCK_D) tile, dropping padded rows and padded head-dim columns."""
    mask = rows[:, None] < n_rows
    if HEAD_DIM != BLOCK_D:
        mask = mask & (cols[None, :] < HEAD_DIM)
    tl.store(ptrs, x, mask=mask)
