"""flashattn2.score_mod: FlexAttention score_mods (closures over captured tensors included) traced and emitted as
@triton.jit functions, checked elementwise against torch running the same mod, value and derivative in the score,
under the interpreter on CPU and on the GPU; unsupported ops raise NotImplementedError naming them."""

import pytest
import torch
import triton
import triton.language as tl

from flashattn2.score_mod import compile_score_mod
from helpers import DEVICE


@triton.jit
def _apply(Score, B, H, Q, K, Out, Grad, n, fn: tl.constexpr, grad: tl.constexpr, captures):
    offs = tl.arange(0, 128)
    keep = offs < n
    score = tl.load(Score + offs, mask=keep, other=0.0)
    b = tl.load(B + offs, mask=keep, other=0)
    h = tl.load(H + offs, mask=keep, other=0)
    q = tl.load(Q + offs, mask=keep, other=0)
    k = tl.load(K + offs, mask=keep, other=0)
    tl.store(Out + offs, fn(score, b, h, q, k, captures), mask=keep)
    tl.store(Grad + offs, grad(score, b, h, q, k, captures), mask=keep)


def _check(score_mod, n=128, scale=8.0):
    torch.manual_seed(0)
    score = (torch.randn(n, device=DEVICE) * scale).float()
    b = torch.randint(0, 2, (n,), device=DEVICE, dtype=torch.int32)
    h = torch.randint(0, 4, (n,), device=DEVICE, dtype=torch.int32)
    q = torch.randint(0, 300, (n,), device=DEVICE, dtype=torch.int32)
    k = torch.randint(0, 300, (n,), device=DEVICE, dtype=torch.int32)
    mod = compile_score_mod(score_mod, DEVICE)
    out, grad = torch.full_like(score, float("nan")), torch.full_like(score, float("nan"))
    _apply[(1,)](score, b, h, q, k, out, grad, n, mod.fn, mod.grad, mod.captures)
    leaf = score.double().requires_grad_()
    ref = torch.vmap(score_mod)(leaf, b, h, q, k)
    # each output depends on its own score alone: the gradient of the sum is the elementwise derivative
    (ref_grad,) = torch.autograd.grad(ref.sum(), leaf)
    torch.testing.assert_close(out.double(), ref.double(), rtol=2e-6, atol=2e-5)
    torch.testing.assert_close(grad.double(), ref_grad.double(), rtol=2e-6, atol=2e-5)
    return mod


def test_alibi_and_bias_tables_from_captured_tensors():
    slopes = torch.rand(4, device=DEVICE)
    bias = torch.randn(2, 4, 16, device=DEVICE)

    def alibi_bias(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx) + bias[b, h, (q_idx - kv_idx) % 16]

    mod = _check(alibi_bias)
    assert len(mod.captures) == 2


def test_captured_tables_of_one_entry():
    # one head's slope table: the trace must not index past it (it indexed at 1 once, an IndexError on one head)
    slope = torch.tensor([0.75], device=DEVICE)

    def one_head_alibi(score, b, h, q_idx, kv_idx):
        return score + slope[h * 0] * (kv_idx - q_idx) + slope[b * 0]

    _check(one_head_alibi)
    one = compile_score_mod(lambda score, b, h, q_idx, kv_idx: score * slope[h], DEVICE)
    assert len(one.captures) == 1


def test_softcap_and_transcendentals():
    def softcap(score, b, h, q_idx, kv_idx):
        return 30.0 * torch.tanh(score / 30.0)

    def mixed(score, b, h, q_idx, kv_idx):
        return torch.sigmoid(score) * torch.exp(-torch.abs(score) / 4) + torch.sqrt(score * score + 1.0)

    _check(softcap, scale=40.0)
    _check(mixed)


def test_relative_positions_with_python_division_signs():
    # kv_idx - q_idx is negative half the time: floor division and remainder must follow Python's signs
    table = torch.randn(64, device=DEVICE)

    def buckets(score, b, h, q_idx, kv_idx):
        rel = kv_idx - q_idx
        bucket = torch.where(rel < 0, rel // 7, rel % 5) + 32
        return torch.where(q_idx >= kv_idx, score + table[bucket.clamp(0, 63)], score * 0.5)

    _check(buckets)


def test_unsupported_op_is_named():
    def erfinv(score, b, h, q_idx, kv_idx):
        return torch.erfinv(score.clamp(-0.5, 0.5))

    with pytest.raises(NotImplementedError, match="erfinv"):
        compile_score_mod(erfinv, DEVICE)
