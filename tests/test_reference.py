"""The oracle itself: it must agree with PyTorch SDPA where their semantics meet, and follow
flash_attn's conventions (bottom-right causal, empty rows give 0 and lse = +inf)."""

import torch

from flashattn2.reference import attention_ref, causal_mask
from helpers import randn


def test_causal_mask_is_bottom_right():
    keep = ~causal_mask(2, 5)
    assert keep.int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    keep = ~causal_mask(5, 2)
    assert keep.int().tolist() == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]


def test_matches_sdpa_in_float64():
    torch.manual_seed(0)
    q, k, v = (randn(2, 9, 4, 16, dtype=torch.float64, device="cpu") for _ in range(3))
    for causal in (False, True):
        out, lse = attention_ref(q, k, v, causal=causal)
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
        torch.testing.assert_close(out, sdpa)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
        if causal:
            scores = scores.masked_fill(causal_mask(9, 9), float("-inf"))
        torch.testing.assert_close(lse, torch.logsumexp(scores, -1))


def test_gqa_repeats_kv_heads_in_groups():
    torch.manual_seed(1)
    q = randn(1, 5, 4, 8, dtype=torch.float64, device="cpu")
    k, v = (randn(1, 7, 2, 8, dtype=torch.float64, device="cpu") for _ in range(2))
    out, _ = attention_ref(q, k, v)
    # query heads 0, 1 read kv head 0; heads 2, 3 read kv head 1
    out_h2, _ = attention_ref(q[:, :, 2:3], k[:, :, 1:2], v[:, :, 1:2])
    torch.testing.assert_close(out[:, :, 2:3], out_h2)


def test_rows_that_see_nothing():
    torch.manual_seed(2)
    q = randn(1, 5, 1, 8, dtype=torch.float64, device="cpu", requires_grad=True)
    k, v = (randn(1, 2, 1, 8, dtype=torch.float64, device="cpu", requires_grad=True) for _ in range(2))
    out, lse = attention_ref(q, k, v, causal=True)
    assert torch.all(out[:, :3] == 0) and torch.all(torch.isposinf(lse[..., :3]))
    assert torch.isfinite(lse[..., 3:]).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.all(q.grad[:, :3] == 0)
