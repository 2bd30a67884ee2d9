"""Tensor descriptors (Hopper's TMA) for the tiles the kernels stream: one copy instruction per tile,
no per-element address arithmetic, and the hardware fills rows past the sequence end and columns past
the head dim with zeros, so streamed tiles need no bounds masks.

Used for inputs whose base and strides meet TMA's 16-byte alignment: dense (batch, seqlen, heads, head_dim)
ones, and (in the portable backward) packed (total, heads, head_dim) ones as one batch entry. A packed
batch's descriptor ends at the last sequence only, so a tile past a sequence's end reads the next sequence's
rows: the kernels give those rows probability 0, as they do rows past seqlen. The kernels' side, load_tile,
is in device/tma.py.
"""

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .common import INTERPRET, has_tma
from .launch import Tiles

_ALIGN_BYTES = 16


def tma_usable(*tensors: torch.Tensor) -> bool:
    """True when every tensor can be read through a descriptor: on a GPU that has TMA (or under the
    interpreter), 16-byte aligned base and strides, unit last stride."""
    if INTERPRET:
        # the interpreter reads bf16 descriptors wrongly (fp16 and fp32 are right), so bf16 keeps pointers
        if any(t.dtype == torch.bfloat16 for t in tensors):
            return False
    elif not all(has_tma(t) for t in tensors):
        return False
    for t in tensors:
        size, strides = t.element_size(), t.stride()
        if strides[-1] != 1 or t.data_ptr() % _ALIGN_BYTES:
            return False
        if any((s * size) % _ALIGN_BYTES for s in strides[:-1]):
            return False
    return True


def one_batch(x: torch.Tensor) -> torch.Tensor:
    """x as (batch, rows, heads, head_dim): a packed (total, heads, head_dim) batch is one batch entry, whose
    sequences are row ranges (what the kernels' tma_batch coordinate assumes)."""
    return x.unsqueeze(0) if x.dim() == 3 else x


def row_tiles(x: torch.Tensor, block_rows: int, block_d: int) -> Tiles:
    """A descriptor over x (batch, seqlen, heads, head_dim), or a packed x as one_batch, handing out
    (block_rows, block_d) tiles of one (batch, head); a Launch argument (launch.Tiles)."""
    return Tiles(one_batch(x), [1, block_rows, 1, block_d], None, TensorDescriptor)
