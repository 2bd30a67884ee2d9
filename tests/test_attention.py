"""Numerics of flash_attn_func and the packed variants against the float64 reference.

On CPU (CI) the kernels run through the Triton interpreter on small shapes; on a GPU the same tests
run compiled, and the tests marked gpu add large shapes, determinism and repeat runs.
"""

import itertools
import zlib

import pytest
import torch

from flashattn2 import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from helpers import ON_GPU, assert_bitwise_repeatable, check_attention, randn

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [32, 40, 64, 96, 128, 256]
# several key tiles with a cut last one; the interpreter (CPU CI) takes 129 rows, a quarter of the work of
# 257 (whose deterministic cases took 12-57 s each there), and the GPU 257
LONG = 257 if ON_GPU else 129
SEQLENS = [(113, 203), (203, 113), (1, 17), (LONG, LONG), (17, 1), (1, 1)]
# (nheads, nheads_k): MHA, GQA, MQA
HEADS = [(4, 4), (6, 2), (3, 1)]


def _cases():
    """dtype x head dim x causal, each paired with a seqlen pair, a head layout and a dQ path so that
    every value of those appears with both dtypes and both causal settings without a full product."""
    for i, (dtype, head_dim, causal) in enumerate(itertools.product(DTYPES, HEAD_DIMS, [False, True])):
        for j in range(2):
            seqlens = SEQLENS[(i + 3 * j) % len(SEQLENS)]
            heads = HEADS[(i + j) % len(HEADS)]
            deterministic = (i + j) % 2 == 1
            yield pytest.param(dtype, head_dim, causal, seqlens, heads, deterministic,
                               id=f"{str(dtype)[6:]}-d{head_dim}-{'causal' if causal else 'full'}-"
                                  f"{seqlens[0]}x{seqlens[1]}-h{heads[0]}_{heads[1]}"
                                  f"{'-det' if deterministic else ''}")


def run_and_check(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, causal, deterministic=False,
                  softmax_scale=None):
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype, requires_grad=True)
    k = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype, requires_grad=True)
    v = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype, requires_grad=True)
    out, lse, s_dmask = flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                        deterministic=deterministic, return_attn_probs=True)
    assert s_dmask is None
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert lse.shape == (batch, nheads, seqlen_q)
    dout = randn(*out.shape, dtype=dtype)
    out.backward(dout)
    check_attention(q, k, v, out, lse, (q.grad, k.grad, v.grad), dout, causal, softmax_scale)


@pytest.mark.parametrize("dtype,head_dim,causal,seqlens,heads,deterministic", list(_cases()))
def test_attention_matches_reference(dtype, head_dim, causal, seqlens, heads, deterministic):
    if dtype == torch.float16 and not ON_GPU and head_dim not in (64, 128):
        pytest.skip("the interpreter runs head dims other than 64 and 128 in bf16 only (CI time)")
    torch.manual_seed(zlib.crc32(repr((dtype, head_dim, causal, seqlens, heads)).encode()))
    run_and_check(1, *seqlens, *heads, head_dim, dtype, causal, deterministic)


@pytest.mark.parametrize("causal,seqlens,heads,head_dim",
                         [(True, (113, 203), (4, 2), 64), (True, (203, 113), (2, 2), 64),
                          (False, (113, 203), (2, 1), 64), (True, (LONG, LONG), (2, 2), 128),
                          (True, (1, 17), (3, 1), 64), (True, (17, 1), (2, 2), 32)])
def test_forward_in_one_key_loop(monkeypatch, causal, seqlens, heads, head_dim):
    # FwdConfig.one_loop: the Triton forward's key tiles as one loop, the diagonal and the keys' end masked by a
    # branch (a cut last tile, seqlen_q above and below seqlen_k, one query row, one key, GQA); the backward checks
    # its lse too. On the Triton backend: the Gluon forward has its own loops
    import dataclasses

    import flashattn2
    from flashattn2.kernels.portable import forward

    pick = forward.fwd_config
    monkeypatch.setattr(forward, "fwd_config", lambda *a, **kw: dataclasses.replace(pick(*a, **kw), one_loop=True))
    monkeypatch.setattr(forward, "_plans", forward.PlanCache())  # no plan made with the default config
    backend = flashattn2.get_backend()
    flashattn2.set_backend("triton")
    try:
        torch.manual_seed(zlib.crc32(repr((causal, seqlens, heads)).encode()))
        run_and_check(2, *seqlens, *heads, head_dim, torch.bfloat16, causal)
    finally:
        flashattn2.set_backend(backend)


@pytest.mark.parametrize("head_dim", [1, 8, 80, 111, 160, 192])
def test_odd_head_dims(head_dim):
    torch.manual_seed(head_dim)
    run_and_check(2, 37, 45, 2, 1, head_dim, torch.bfloat16, causal=head_dim % 2 == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_scale(causal):
    torch.manual_seed(7)
    run_and_check(1, 70, 90, 2, 2, 64, torch.float16, causal, softmax_scale=0.3)


@pytest.mark.parametrize("causal", [False, True])
def test_qkvpacked(causal):
    torch.manual_seed(11)
    batch, seqlen, nheads, head_dim = 2, 75, 3, 64
    qkv = randn(batch, seqlen, 3, nheads, head_dim, dtype=torch.bfloat16, requires_grad=True)
    out, lse, _ = flash_attn_qkvpacked_func(qkv, causal=causal, return_attn_probs=True)
    dout = randn(*out.shape, dtype=torch.bfloat16)
    out.backward(dout)
    q, k, v = qkv.detach().unbind(2)
    check_attention(q, k, v, out, lse, qkv.grad.unbind(2), dout, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_kvpacked_gqa(causal):
    torch.manual_seed(13)
    batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim = 2, 50, 81, 4, 2, 32
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=torch.float16, requires_grad=True)
    kv = randn(batch, seqlen_k, 2, nheads_k, head_dim, dtype=torch.float16, requires_grad=True)
    out, lse, _ = flash_attn_kvpacked_func(q, kv, causal=causal, return_attn_probs=True)
    dout = randn(*out.shape, dtype=torch.float16)
    out.backward(dout)
    k, v = kv.detach().unbind(2)
    check_attention(q, k, v, out, lse, (q.grad, *kv.grad.unbind(2)), dout, causal)


def test_strided_inputs_without_copies():
    """(batch, nheads, seqlen, headdim) storage seen through a transpose: only the last stride is 1."""
    torch.manual_seed(17)
    dtype = torch.bfloat16
    q, k, v = (randn(2, 3, 66, 64, dtype=dtype).transpose(1, 2).requires_grad_() for _ in range(3))
    assert not q.is_contiguous() and q.stride(-1) == 1
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    dout = randn(*out.shape, dtype=dtype)
    out.backward(dout)
    check_attention(q, k, v, out, lse, (q.grad, k.grad, v.grad), dout, True)


def test_forward_without_grad_and_noncontiguous_dout():
    torch.manual_seed(19)
    q, k, v = (randn(1, 40, 2, 32, dtype=torch.float16) for _ in range(3))
    with torch.no_grad():
        out = flash_attn_func(q, k, v)
    assert out.shape == q.shape and not out.requires_grad
    # a dout whose head dim is not contiguous must still give correct gradients
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    dout = randn(1, 40, 32, 2, dtype=torch.float16).transpose(-1, -2)
    assert dout.stride(-1) != 1
    out.backward(dout)
    check_attention(q, k, v, out, lse, (q.grad, k.grad, v.grad), dout.contiguous(), False)


def test_deterministic_backward_is_bitwise_repeatable():
    torch.manual_seed(23)
    q, k, v = (randn(1, 70, 4, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = randn(1, 70, 4, 32, dtype=torch.bfloat16)
    assert_bitwise_repeatable(lambda q, k, v: flash_attn_func(q, k, v, causal=True, deterministic=True),
                              q, k, v, dout, times=3)


def test_zero_length_sequences():
    q = randn(2, 0, 2, 32, dtype=torch.float16, requires_grad=True)
    k = randn(2, 5, 2, 32, dtype=torch.float16, requires_grad=True)
    v = randn(2, 5, 2, 32, dtype=torch.float16, requires_grad=True)
    out = flash_attn_func(q, k, v)
    assert out.shape == q.shape
    out.sum().backward()
    assert torch.count_nonzero(k.grad) == 0 and torch.count_nonzero(v.grad) == 0


@pytest.mark.parametrize("head_dim", [64, 128])
def test_empty_calls_stay_off_the_gluon_kernels(head_dim):
    # no query rows, or no keys, at the Gluon kernels' head dims: their descriptors need non-empty tensors, so these
    # calls stay on the portable kernels (which answer without a launch) under "gluon" as well: out 0 and lse +inf
    # where there is no key, zero gradients
    import flashattn2
    from flashattn2.kernels import backends

    backend = flashattn2.get_backend()
    try:
        for choice in ("auto", "gluon") if backends.GLUON_AVAILABLE else ("auto",):
            flashattn2.set_backend(choice)
            for rows, keys in ((0, 5), (7, 0)):
                q = randn(2, rows, 2, head_dim, dtype=torch.bfloat16, requires_grad=True)
                k, v = (randn(2, keys, 2, head_dim, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
                chosen = flashattn2.attention_backend(q, k, v)
                assert chosen.forward == "triton" and chosen.backward == "triton", chosen
                assert "empty tensor" in chosen.reason, chosen.reason
                out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
                assert out.shape == q.shape and (out == 0).all() and (lse == float("inf")).all()
                out.float().sum().backward()
                assert all(torch.count_nonzero(x.grad) == 0 for x in (q, k, v))
    finally:
        flashattn2.set_backend(backend)


def test_the_pass_rule_can_fail():
    """A 2% error in the softmax scale, or a causal mask left out, must be caught by check_attention."""
    from flashattn2.kernels import common

    assert common.POISON_OUTPUTS, "outputs must be NaN-poisoned in tests"
    torch.manual_seed(29)
    q, k, v = (randn(1, 64, 2, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = randn(1, 64, 2, 32, dtype=torch.bfloat16)
    for kwargs, causal in (({"softmax_scale": 1.02 / 32**0.5}, False), ({"causal": False}, True)):
        out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **kwargs)
        with pytest.raises(AssertionError):
            check_attention(q, k, v, out, lse, None, dout, causal)


def test_descriptor_eligibility():
    """Tensor descriptors need 16-byte aligned base and strides; anything else must fall back to
    pointer loads rather than fault. Under the interpreter bf16 always takes pointers."""
    from flashattn2.kernels.common import INTERPRET
    from flashattn2.kernels.tma import tma_usable

    if not INTERPRET and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("no TMA before Hopper")
    aligned = randn(2, 64, 4, 64, dtype=torch.float16)
    assert tma_usable(aligned)
    assert not tma_usable(randn(2, 64, 4, 111, dtype=torch.float16))  # row stride 444 * 2 bytes
    assert not tma_usable(randn(2, 64, 4, 65, dtype=torch.float16)[..., 1:])  # base 2 bytes in
    assert tma_usable(randn(2, 64, 4, 64, dtype=torch.bfloat16)) == (not INTERPRET)
