"""FLASHATTN2_STRICT=1: the index tensors' values (cu_seqlens, cache_seqlens, cache_batch_idx, cache_leftpad,
block_table) are read on the host and each bad value raises a ValueError naming it at the call; valid calls give
the same answer as without it. Off (the default), no value is read on the host."""

import pytest
import torch

import flashattn2
from flashattn2 import checks
from helpers import DEVICE, randn


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setattr(checks, "STRICT", True)


def _varlen(total=48):
    return tuple(randn(total, 2, 32, dtype=torch.float16) for _ in range(3))


def _cu(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("values,message", [
    ([1, 20, 48], r"cu_seqlens_q\[0\] must be 0"),
    ([0, 40, 30], r"must not decrease: cu_seqlens_q\[2\] = 30"),
    ([0, 20, 60], r"cu_seqlens_q\[-1\] = 60 is past the 48 packed rows"),
    ([0, 2, 48], r"sequence 1 has 46 rows by cu_seqlens_q, more than max_seqlen_q = 40"),
])
def test_strict_cu_seqlens_name_the_bad_value(strict, values, message):
    q, k, v = _varlen()
    good = _cu([0, 20, 48])
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_varlen_func(q, k, v, _cu(values), good, 40, 40)


def test_strict_valid_calls_match(strict, monkeypatch):
    q, k, v = _varlen()
    cu = _cu([0, 20, 48])
    out = flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, 28, 28, causal=True)
    monkeypatch.setattr(checks, "STRICT", False)
    assert torch.equal(out, flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, 28, 28, causal=True))


def test_strict_off_reads_no_value(monkeypatch):
    # the default stays sync-free: the host never sees the index tensors' values
    def fail(*args):
        raise AssertionError("an index tensor was read on the host")

    monkeypatch.setattr(checks, "_host_values", fail)
    q, k, v = _varlen()
    cu = _cu([0, 20, 48])
    flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, 28, 28)
    flashattn2.flash_attn_with_kvcache(randn(2, 1, 2, 32, dtype=torch.float16),
                                       randn(2, 64, 2, 32, dtype=torch.float16),
                                       randn(2, 64, 2, 32, dtype=torch.float16), cache_seqlens=_cu([5, 9]))


def test_strict_kvcache_names_the_bad_value(strict):
    q = randn(2, 1, 2, 32, dtype=torch.float16)
    k_cache, v_cache = (randn(3, 64, 2, 32, dtype=torch.float16) for _ in range(2))
    k_new, v_new = (randn(2, 1, 2, 32, dtype=torch.float16) for _ in range(2))
    kvcache = flashattn2.flash_attn_with_kvcache
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 64 with 1 new rows does not fit"):
        kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=_cu([3, 64]))
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = -1"):
        kvcache(q, k_cache, v_cache, cache_seqlens=_cu([-1, 4]))
    with pytest.raises(ValueError, match=r"cache_batch_idx\[1\] = 3 is not one of the 3 cache rows"):
        kvcache(q, k_cache, v_cache, cache_seqlens=_cu([3, 4]), cache_batch_idx=_cu([0, 3]))
    with pytest.raises(ValueError, match=r"cache_leftpad\[0\] = 5 must be within \[0, cache_seqlens\[0\] = 3\]"):
        kvcache(q, k_cache, v_cache, cache_seqlens=_cu([3, 4]), cache_leftpad=_cu([5, 0]))
    # a paged cache: pages of 16, four per sequence; sequence 1 uses 2 pages (20 keys), its second is out of range
    pool_k, pool_v = (randn(6, 16, 2, 32, dtype=torch.float16) for _ in range(2))
    table = _cu([[0, 1, 2, 3], [4, 9, 0, 0]])
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 9 is not a page of the 6-page cache"):
        kvcache(q, pool_k, pool_v, cache_seqlens=_cu([8, 20]), block_table=table)
    kvcache(q, pool_k, pool_v, cache_seqlens=_cu([8, 16]), block_table=table)  # its first page only: fine


def test_strict_paged_varlen_block_table(strict):
    q = randn(8, 2, 32, dtype=torch.float16)
    pool_k, pool_v = (randn(4, 16, 2, 32, dtype=torch.float16) for _ in range(2))
    cu_q, cu_k = _cu([0, 4, 8]), _cu([0, 10, 40])
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 7 is not a page of the 4-page cache"):
        flashattn2.flash_attn_varlen_func(q, pool_k, pool_v, cu_q, cu_k, 4, 30, block_table=_cu([[0, 0], [1, 7]]))
