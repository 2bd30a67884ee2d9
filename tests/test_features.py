"""The training features: sliding window, softcap, ALiBi, dropout and variable-length batches, alone and
combined, each checked against the float64 reference with the same pass rule as the core suite."""

import zlib

import pytest
import torch
import triton
import triton.language as tl

from flashattn2 import (
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    pad_input,
    unpad_input,
)
from flashattn2.kernels.device.mask import score_mask, score_mask_rel
from helpers import DEVICE, assert_bitwise_repeatable, check_attention, check_varlen, randn


def _seed(*key):
    torch.manual_seed(zlib.crc32(repr(key).encode()))


def _run_dense(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, **kwargs):
    """Forward + backward through flash_attn_func, then the pass rule (the dropout mask, if any, is
    read back from S_dmask and handed to the reference)."""
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype, requires_grad=True)
    k = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype, requires_grad=True)
    v = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype, requires_grad=True)
    out, lse, s_dmask = flash_attn_func(q, k, v, return_attn_probs=True, **kwargs)
    dout = randn(*out.shape, dtype=dtype)
    out.backward(dout)
    ref_kwargs = {key: kwargs[key] for key in ("causal", "softmax_scale", "window_size", "softcap",
                                                "alibi_slopes", "dropout_p") if key in kwargs}
    if kwargs.get("dropout_p", 0.0) > 0:
        assert s_dmask.shape == (batch, nheads, seqlen_q, seqlen_k)
        ref_kwargs["dropout_mask"] = ~torch.signbit(s_dmask)
    check_attention(q, k, v, out, lse, (q.grad, k.grad, v.grad), dout, **ref_kwargs)
    return out, lse


WINDOWS = [(16, 0), (8, 8), (-1, 5), (30, -1), (0, 0)]


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("seqlens", [(113, 203), (203, 113), (64, 64), (1, 17)], ids=str)
def test_sliding_window(window, seqlens):
    _seed(window, seqlens)
    _run_dense(1, *seqlens, 2, 1, 32, torch.bfloat16, window_size=window)


@pytest.mark.parametrize("window", [(16, 0), (40, 3)], ids=str)
def test_causal_with_window(window):
    """causal=True pins the window's right edge to the diagonal, whatever window_size[1] says."""
    _seed("causal-window", window)
    _run_dense(2, 90, 77, 2, 2, 64, torch.float16, causal=True, window_size=window)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_softcap(causal, dtype):
    _seed("softcap", causal, dtype)
    # a large scale drives many scores into the cap, where tanh bends
    _run_dense(1, 70, 95, 4, 2, 64, dtype, causal=causal, softcap=3.0, softmax_scale=0.6)


@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes_h", "slopes_bh"])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi(per_batch, causal):
    _seed("alibi", per_batch, causal)
    shape = (2, 4) if per_batch else (4,)
    slopes = torch.rand(*shape, dtype=torch.float32, device=DEVICE) * 0.5
    _run_dense(2, 65, 81, 4, 2, 32, torch.bfloat16, causal=causal, alibi_slopes=slopes)


@pytest.mark.parametrize("kwargs", [
    {"dropout_p": 0.17},
    {"dropout_p": 0.3, "causal": True},
    {"dropout_p": 0.25, "window_size": (20, 4)},
    {"dropout_p": 0.2, "softcap": 4.0},  # flash_attn refuses this pair; here it is supported
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_dropout_matches_reference_with_its_mask(kwargs):
    _seed("dropout", kwargs)
    _run_dense(2, 67, 90, 4, 2, 32, torch.float16, **kwargs)


def test_dropout_keeps_one_minus_p_and_is_unbiased():
    """64 heads share one q, k, v: each head draws its own mask, so their mean estimates E[out]."""
    _seed("dropout-stats")
    p, nheads, seqlen = 0.3, 64, 32
    q, k, v = (randn(1, seqlen, 1, 16, dtype=torch.float16).expand(1, seqlen, nheads, 16).contiguous()
               for _ in range(3))
    out, _, s_dmask = flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
    kept = (~torch.signbit(s_dmask)).double().mean().item()
    n = s_dmask.numel()
    assert abs(kept - (1 - p)) <= 5 * (p * (1 - p) / n) ** 0.5, f"kept fraction {kept:.4f}, expected {1 - p}"
    expected = flash_attn_func(q, k, v)[:, :, 0].double()
    heads = out.double()
    mean, stderr = heads.mean(dim=2), heads.std(dim=2) / nheads**0.5
    assert torch.all((mean - expected).abs() <= 5 * stderr + 2e-3), "dropout output is biased"


def test_dropout_follows_torch_manual_seed():
    q, k, v = (randn(1, 40, 2, 32, dtype=torch.bfloat16) for _ in range(3))
    torch.manual_seed(5)
    a = flash_attn_func(q, k, v, dropout_p=0.5)
    torch.manual_seed(5)
    b = flash_attn_func(q, k, v, dropout_p=0.5)
    c = flash_attn_func(q, k, v, dropout_p=0.5)
    assert torch.equal(a, b) and not torch.equal(a, c)


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


# lengths 0, 1 and long mixed; a query sequence whose keys are empty gives zeros
SEQLENS_Q = [0, 1, 37, 130, 5]
SEQLENS_K = [3, 1, 50, 130, 0]


def _run_varlen(seqlens_q, seqlens_k, nheads, nheads_k, head_dim, dtype, **kwargs):
    cu_q, cu_k = _cu(seqlens_q), _cu(seqlens_k)
    q = randn(sum(seqlens_q), nheads, head_dim, dtype=dtype, requires_grad=True)
    k = randn(sum(seqlens_k), nheads_k, head_dim, dtype=dtype, requires_grad=True)
    v = randn(sum(seqlens_k), nheads_k, head_dim, dtype=dtype, requires_grad=True)
    out, lse, s_dmask = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                               return_attn_probs=True, **kwargs)
    assert lse.shape == (nheads, sum(seqlens_q))
    dout = randn(*out.shape, dtype=dtype)
    out.backward(dout)
    ref_kwargs = {key: kwargs[key] for key in ("causal", "softmax_scale", "window_size", "softcap",
                                                "alibi_slopes", "dropout_p") if key in kwargs}
    if kwargs.get("dropout_p", 0.0) > 0:
        ref_kwargs["dropout_masks"] = ~torch.signbit(s_dmask)
    check_varlen(q, k, v, out, lse, (q.grad, k.grad, v.grad), dout, cu_q, cu_k, **ref_kwargs)


@pytest.mark.parametrize("kwargs", [
    {},
    {"causal": True},
    {"window_size": (12, 3)},
    {"causal": True, "window_size": (20, -1), "alibi_slopes": "bh"},  # GQA + varlen + window + ALiBi
    {"dropout_p": 0.2, "causal": True},
    {"softcap": 2.5, "alibi_slopes": "h"},
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "plain")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_varlen(kwargs, dtype):
    if dtype == torch.float16 and DEVICE == "cpu" and kwargs not in ({}, {"causal": True}):
        pytest.skip("the interpreter runs the options in bf16 only (CI time)")
    _seed("varlen", kwargs, dtype)
    kwargs = dict(kwargs)
    if "alibi_slopes" in kwargs:
        shape = (len(SEQLENS_Q), 4) if kwargs["alibi_slopes"] == "bh" else (4,)
        kwargs["alibi_slopes"] = torch.rand(*shape, dtype=torch.float32, device=DEVICE) * 0.3
    _run_varlen(SEQLENS_Q, SEQLENS_K, 4, 2, 32, dtype, **kwargs)


def test_varlen_packed_variants_match_unpacked():
    _seed("varlen-packed")
    seqlens = [5, 0, 33, 64]
    cu = _cu(seqlens)
    qkv = randn(sum(seqlens), 3, 2, 64, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(1)
    expected = flash_attn_varlen_func(q, k, v, cu, cu, 64, 64, causal=True)
    torch.testing.assert_close(flash_attn_varlen_qkvpacked_func(qkv, cu, 64, causal=True), expected,
                               rtol=0, atol=0)
    torch.testing.assert_close(flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, 64, 64, causal=True),
                               expected, rtol=0, atol=0)


def test_unpad_pad_and_varlen_against_the_padded_batch():
    """unpad_input -> varlen attention -> pad_input equals dense attention on each unpadded sequence."""
    _seed("unpad")
    batch, seqlen, nheads, head_dim = 3, 48, 2, 32
    lengths = torch.tensor([48, 17, 1])
    mask = torch.arange(seqlen)[None, :] < lengths[:, None]
    x = randn(batch, seqlen, 3, nheads, head_dim, dtype=torch.float16)
    packed, indices, cu, max_len, used = unpad_input(x, mask.to(DEVICE))
    assert packed.shape == (int(lengths.sum()), 3, nheads, head_dim) and max_len == 48
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 48, 65, 66] and used.tolist() == [48, 17, 1]
    torch.testing.assert_close(pad_input(packed, indices, batch, seqlen)[mask], x[mask.to(DEVICE)])
    out = pad_input(flash_attn_varlen_qkvpacked_func(packed, cu, max_len, causal=True), indices, batch, seqlen)
    for b, n in enumerate(lengths.tolist()):
        dense = flash_attn_func(*x[b:b + 1, :n].unbind(2), causal=True)
        torch.testing.assert_close(out[b:b + 1, :n], dense, rtol=0, atol=0)
        assert torch.all(out[b, n:] == 0)


def test_deterministic_with_every_feature():
    _seed("det-all")
    q, k, v = (randn(2, 70, 4, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = randn(2, 70, 4, 32, dtype=torch.bfloat16)
    slopes = torch.rand(4, dtype=torch.float32, device=DEVICE)

    def run(q, k, v):
        return flash_attn_func(q, k, v, dropout_p=0.1, causal=True, window_size=(24, 0), softcap=5.0,
                               alibi_slopes=slopes, deterministic=True)

    assert_bitwise_repeatable(run, q, k, v, dout, times=2, seed=3)


@pytest.mark.parametrize("kwargs", [
    {"causal": True, "window_size": (10, 0), "softcap": 2.0, "alibi_slopes": True, "dropout_p": 0.15},
    {"window_size": (7, 9), "alibi_slopes": True},
], ids=["everything", "window-alibi"])
def test_feature_combinations(kwargs):
    _seed("combo", kwargs)
    kwargs = dict(kwargs)
    if kwargs.get("alibi_slopes"):
        kwargs["alibi_slopes"] = torch.rand(2, 4, dtype=torch.float32, device=DEVICE) * 0.3
    _run_dense(2, 57, 73, 4, 1, 40, torch.bfloat16, **kwargs)


@triton.jit
def _mask_forms(out_ptr, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT: tl.constexpr,
                HAS_RIGHT: tl.constexpr, M: tl.constexpr, N: tl.constexpr):
    q = tl.arange(0, M)
    k = tl.arange(0, N)
    forward = score_mask(q[:, None], k[None, :], seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT, HAS_RIGHT)
    backward = score_mask_rel(k[:, None], q[None, :], seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT,
                              HAS_RIGHT)
    tl.store(out_ptr + q[:, None] * N + k[None, :], forward.to(tl.int32))
    tl.store(out_ptr + M * N + k[:, None] * M + q[None, :], backward.to(tl.int32))


@pytest.mark.parametrize("seqlens", [(40, 40), (29, 50), (50, 29), (64, 1)])
@pytest.mark.parametrize("window", [(-1, 0), (5, 0), (-1, 7), (9, 3), (6, -1), (-1, -1)])
def test_mask_forms_agree_with_the_window(seqlens, window):
    # both mask forms (a queries x keys tile, the forward's; keys x queries, the Gluon backward's) against the
    # window's definition, over a tile reaching past both sequence ends: keys past the end are hidden, rows past
    # it follow the same rule
    seqlen_q, seqlen_k = seqlens
    left, right = window
    m, n = 64, 64
    out = torch.full((2 * m * n,), -1, dtype=torch.int32, device=DEVICE)
    _mask_forms[(1,)](out, seqlen_q, seqlen_k, left, right, left >= 0, right >= 0, m, n)
    q = torch.arange(m, device=DEVICE)[:, None]
    k = torch.arange(n, device=DEVICE)[None, :]
    diag = q + seqlen_k - seqlen_q
    want = (k < seqlen_k) & (q >= 0)  # full tile shape
    if right >= 0:
        want &= k <= diag + right
    if left >= 0:
        want &= k >= diag - left
    assert torch.equal(out[: m * n].view(m, n).bool(), want)
    assert torch.equal(out[m * n:].view(n, m).t().bool(), want)
