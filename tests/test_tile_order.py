"""The order in which a grid takes its work items (kernels/device/tile_order.py): on CPU through the
interpreter (or the GPU), every (block, batch x head) item exactly once, section by section, block-major inside a
section; section 1 is the order of before (one head's blocks after another's)."""

import pytest
import torch
import triton
import triton.language as tl

from flashattn2.kernels.common import l2_section
from flashattn2.kernels.device.tile_order import sectioned_item, sectioned_items
from helpers import DEVICE


@triton.jit
def _order_kernel(Out, num_blocks, num_bh, section):
    tile = tl.program_id(0)
    block, bh = sectioned_item(tile, num_blocks, num_bh, section)
    tl.store(Out + 2 * tile, block)
    tl.store(Out + 2 * tile + 1, bh)


def order(num_blocks: int, num_bh: int, section: int) -> list[tuple[int, int]]:
    out = torch.full((num_blocks * num_bh, 2), -1, dtype=torch.int32, device=DEVICE)
    _order_kernel[(num_blocks * num_bh,)](out, num_blocks, num_bh, section)
    return [tuple(row) for row in out.tolist()]


@pytest.mark.parametrize("num_blocks,num_bh,section", [(3, 5, 2), (4, 8, 4), (1, 7, 4), (5, 3, 8), (2, 6, 1)])
def test_sectioned_walk(num_blocks, num_bh, section):
    items = order(num_blocks, num_bh, section)
    assert sorted(items) == [(b, h) for b in range(num_blocks) for h in range(num_bh)]
    expected = []
    for first in range(0, num_bh, section):
        heads = range(first, min(first + section, num_bh))
        expected += [(b, h) for b in range(num_blocks) for h in heads]
    assert items == expected
    if section == 1:
        assert items == [(t % num_blocks, t // num_blocks) for t in range(num_blocks * num_bh)]
    # the host's copy of the walk (the persistent causal forward's schedule) takes the same order
    assert list(zip(*(x.tolist() for x in sectioned_items(num_blocks, num_bh, section)), strict=True)) == items


def test_l2_section_is_a_power_of_two_that_fits(monkeypatch):
    from flashattn2.kernels import common

    monkeypatch.setattr(common, "_l2_bytes", lambda index: 50 * 2**20)
    device = torch.device("cuda", 0)
    assert l2_section(4 * 2**20, device) == 8  # 12 fit
    assert l2_section(16 * 2**20, device) == 2
    assert l2_section(64 * 2**20, device) == 1  # not even one: one head's blocks after another's
    assert l2_section(1, device) == 2**25
