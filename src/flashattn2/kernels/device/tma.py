"""Loading one streamed tile through a tensor descriptor (tma.py makes them) or through plain pointers."""

import triton
import triton.language as tl

from ..common import load_rows


@triton.jit
def load_tile(src, off_b, off_h, start, offs_rows, n_rows, stride_row, offs_d,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
              CHECK_ROWS: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows [start, start + BLOCK_R) of one (batch, head): src is a row_tiles descriptor with USE_TMA,
    else a pointer to that (batch, head)'s first row."""
    if USE_TMA:
        tile = src.load([off_b, start, off_h, 0]).reshape(BLOCK_R, BLOCK_D)
    else:
        tile = load_rows(src + offs_rows[:, None] * stride_row + offs_d[None, :], offs_rows, n_rows, offs_d,
                         HEAD_DIM, BLOCK_D, CHECK_ROWS)
    return tile


@triton.jit
def tma_batch(off_b, IS_VARLEN: tl.constexpr):
    """The batch coordinate of sequence off_b's TMA tiles: a packed batch is one (1, total, heads, head_dim)
    view, whose sequences are row ranges of batch entry 0."""
    if IS_VARLEN:
        return 0
    else:
        return off_b
