"""The order in which a grid takes its work items (FlashAttention-3/4's L2-sectioned, longest-first walk).

A work item is (block, batch x head): a query tile in the forward, a key tile in the backward. The grid walks
sections of `section` (batch, head) pairs whose streamed tensors fit in L2 together, and inside a section block
by block, every pair's block b before any pair's block b + 1. When the first blocks are the longest (causal:
see `longest_first`), long items start early and the grid ends on short ones, instead of on the last head's
longest item. section = 1 is one head's blocks after another's.
"""

import heapq

import numpy as np
import triton
import triton.language as tl


@triton.jit
def sectioned_item(tile, num_blocks, num_bh, section):
    """Work item `tile` as (block, batch x head index) in the sectioned walk above."""
    if section == 1:  # folds away where the launch passes 1 (Triton specializes an int argument equal to 1)
        return tile % num_blocks, tile // num_blocks
    first_bh = (tile // (section * num_blocks)) * section
    in_section = tile - first_bh * num_blocks
    heads = tl.minimum(section, num_bh - first_bh)  # the last section may hold fewer pairs
    block = in_section // heads
    return block, first_bh + in_section - block * heads


def sectioned_items(num_blocks: int, num_bh: int, section: int) -> tuple[np.ndarray, np.ndarray]:
    """sectioned_item for every tile at once, on the host: (block, batch x head index) arrays in walk order, for
    the host's schedules (sm90/forward.py, sm90/backward.py). tests/test_tile_order.py holds the two equal."""
    tile = np.arange(num_blocks * num_bh)
    first_bh = tile // (section * num_blocks) * section
    heads = np.minimum(section, num_bh - first_bh)
    in_section = tile - first_bh * num_blocks
    block = in_section // heads
    return block, first_bh + in_section - block * heads


# the most work items a plan schedules on the host (schedule_items: about 0.1 s per 131k items, once per plan)
MAX_SCHEDULED_ITEMS = 1 << 20


def schedule_items(costs: np.ndarray, programs: int) -> np.ndarray:
    """Items 0..n-1 of a walk, each given to the program that would be free first if item i cost costs[i] (a
    dynamic scheduler's order, longest-processing-time style, worked out once per plan on the host), as one int32
    table: programs + 1 offsets, then every program's items in walk order."""
    loads = [(0.0, p) for p in range(programs)]
    owner = np.empty(len(costs), dtype=np.int64)
    for i, cost in enumerate(costs.tolist()):
        load, p = heapq.heappop(loads)
        owner[i] = p
        heapq.heappush(loads, (load + cost, p))
    order = np.argsort(owner, kind="stable")  # by program, walk order within one
    offsets = np.zeros(programs + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=programs), out=offsets[1:])
    return np.concatenate([offsets, order]).astype(np.int32)


# a decoded schedule's fields (block, batch, head) in one int64 an item: each is below the items' count, at most
# MAX_SCHEDULED_ITEMS (2**20)
ITEM_BITS = 21


def decoded_schedule(table: np.ndarray, programs: int, num_blocks: int, num_bh: int, section: int, heads: int,
                     reverse: bool) -> np.ndarray:
    """schedule_items' table as int64, every item as the kernels place it (sm90 WorkGrid.item): block | batch <<
    ITEM_BITS | head << 2 * ITEM_BITS, the block counted from the last where `reverse`. A program then loads its
    item's place in one load instead of working it out with four integer divisions (about 80 instructions an
    item, sm_90 SASS); three loads an item lost 6% at d128 causal 512 (the compiler issued two after a branch)."""
    offsets, order = table[:programs + 1].astype(np.int64), table[programs + 1:]
    block, bh = sectioned_items(num_blocks, num_bh, section)
    block, bh = block[order].astype(np.int64), bh[order].astype(np.int64)
    if reverse:
        block = num_blocks - 1 - block
    assert max(num_blocks, num_bh) <= MAX_SCHEDULED_ITEMS < 1 << ITEM_BITS
    items = block | (bh // heads) << ITEM_BITS | (bh % heads) << 2 * ITEM_BITS
    return np.concatenate([offsets, items])
