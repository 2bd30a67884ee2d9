"""Attention sinks (`learnable_sink`, issue 27): flash_attn_func, flash_attn_varlen_func (packed and paged) and
flash_attn_with_kvcache against the float64 reference with the sink as one more softmax column, by flash_attn's
rule: out, lse (which includes the sink), dq, dk, dv and the sink's own gradient; large and small sinks, causal,
windows, GQA, softcap; the named errors. On the CPU interpreter and the GPU."""

import pytest
import torch

import flashattn2
from flashattn2.reference import attention_ref
from helpers import (
    BWD_FACTOR,
    DEVICE,
    FWD_FACTOR,
    assert_close_to_ref,
    compiled_in_one_graph,
    packed_sequences,
    randn,
)


def _ref(q, k, v, sink, dout, upcast, **opts):
    """Reference (out, lse, dq, dk, dv, dsink) in float64 (upcast) or in the input dtype."""
    opts.pop("deterministic", None)  # a backward option: the reference has one way only
    leaves = [(x.detach().double() if upcast else x.detach().clone()).requires_grad_() for x in (q, k, v, sink)]
    if not upcast:
        leaves[3] = sink.detach().to(q.dtype).requires_grad_()
    out, lse = attention_ref(*leaves[:3], upcast=upcast, learnable_sink=leaves[3], **opts)
    out.backward(dout.to(out.dtype))
    return (out.detach(), lse.detach(), *(x.grad for x in leaves))


def _compare(results, ours):
    ref, pt = results
    names = ("out", "lse", "dq", "dk", "dv", "dsink")
    for i, (name, mine) in enumerate(zip(names, ours, strict=True)):
        if mine is None:
            continue
        factor = FWD_FACTOR if i < 2 else BWD_FACTOR
        assert_close_to_ref(name, mine.float(), ref[i], pt[i].float(), factor)


OPTIONS = [
    dict(),
    dict(causal=True),
    dict(window_size=(20, 5)),
    dict(causal=True, softcap=5.0),
    dict(causal=True, deterministic=True),  # dsink summed in torch ops, not by the preprocess's atomics
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()) or "plain")
@pytest.mark.parametrize("scale", [0.3, 4.0], ids=["small_sink", "large_sink"])
def test_dense_sink_forward_and_gradients(opts, scale):
    torch.manual_seed(0)
    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim = 2, 70, 90, 4, 2, 32
    q = randn(batch, seqlen_q, heads, head_dim, dtype=torch.bfloat16, requires_grad=True)
    k, v = (randn(batch, seqlen_k, heads_k, head_dim, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    # sinks around the scores' own size, or above them: the large ones take most of each row
    sink = (torch.randn(heads, device=DEVICE) * scale).requires_grad_()
    out, lse, _ = flashattn2.flash_attn_func(q, k, v, learnable_sink=sink, return_attn_probs=True, **opts)
    dout = randn(*out.shape, dtype=out.dtype)
    out.backward(dout)
    results = [_ref(q, k, v, sink, dout, upcast, **opts) for upcast in (True, False)]
    _compare(results, (out, lse, q.grad, k.grad, v.grad, sink.grad))


def test_sink_alone_requires_grad_and_lse_includes_it():
    # dsink alone (q, k, v frozen); the lse: logaddexp of the sink-free lse and the sink; a bf16 sink gets a
    # bf16 gradient, the float32 one rounded
    torch.manual_seed(1)
    q, k, v = (randn(1, 40, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    sink = torch.tensor([1.5, -0.5], device=DEVICE, requires_grad=True)
    out, lse, _ = flashattn2.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, return_attn_probs=True)
    dout = randn(*out.shape, dtype=out.dtype)
    out.backward(dout)
    results = [_ref(q, k, v, sink, dout, upcast, causal=True) for upcast in (True, False)]
    _compare(results, (out, lse, None, None, None, sink.grad))
    _, lse0, _ = flashattn2.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    torch.testing.assert_close(lse, torch.logaddexp(lse0, sink.detach().view(1, -1, 1)))
    sink16 = sink.detach().to(torch.bfloat16).requires_grad_()
    flashattn2.flash_attn_func(q, k, v, causal=True, learnable_sink=sink16).backward(dout)
    assert sink16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(sink16.grad.float(), sink.grad, rtol=1e-2, atol=1e-2)


def test_varlen_sink_forward_and_gradients():
    torch.manual_seed(2)
    lens_q, lens_k, heads, heads_k, head_dim = [30, 0, 45], [50, 20, 45], 4, 2, 64
    cu_q, cu_k = (torch.tensor([0] + lens, device=DEVICE).cumsum(0).to(torch.int32) for lens in (lens_q, lens_k))
    q = randn(sum(lens_q), heads, head_dim, dtype=torch.float16, requires_grad=True)
    k, v = (randn(sum(lens_k), heads_k, head_dim, dtype=torch.float16, requires_grad=True) for _ in range(2))
    sink = torch.randn(heads, device=DEVICE).requires_grad_()
    out, lse, _ = flashattn2.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                                    learnable_sink=sink, return_attn_probs=True)
    dout = randn(*out.shape, dtype=out.dtype)
    out.backward(dout)
    dsink_ref = [0.0, 0.0]
    for sq, sk, seq in packed_sequences(q, k, v, cu_q, cu_k, lens_q, lens_k):
        results = [_ref(*seq, sink, dout[sq][None], upcast, causal=True) for upcast in (True, False)]
        mine = (out[sq][None], lse[:, sq][None], q.grad[sq][None], k.grad[sk][None], v.grad[sk][None], None)
        _compare(results, mine)
        dsink_ref = [a + r[5] for a, r in zip(dsink_ref, results, strict=True)]
    assert_close_to_ref("dsink", sink.grad, dsink_ref[0], dsink_ref[1].float(), BWD_FACTOR)


@pytest.mark.parametrize("paged,num_splits", [(False, 1), (False, 3), (True, 0)])
def test_kvcache_and_paged_varlen_sink_forward(paged, num_splits):
    # the KV-cache kernel folds the sink in when it does not split the keys, the merge of the splits when it does
    torch.manual_seed(3)
    batch, heads, heads_k, head_dim, lens = 2, 4, 1, 64, [37, 80]
    sink = torch.randn(heads, device=DEVICE) * 2
    q = randn(batch, 1, heads, head_dim, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(batch, 96, heads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    if paged:
        page = 16
        pages = [x.view(batch * 96 // page, page, heads_k, head_dim) for x in (k_cache, v_cache)]
        table = torch.arange(batch * 96 // page, dtype=torch.int32, device=DEVICE).view(batch, -1)
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE)
        cu_k = torch.tensor([0] + lens, device=DEVICE).cumsum(0).to(torch.int32)
        out, lse, _ = flashattn2.flash_attn_varlen_func(q[:, 0], *pages, cu_q, cu_k, 1, max(lens), block_table=table,
                                                        learnable_sink=sink, return_attn_probs=True)
        out, lse = out[:, None], lse.transpose(0, 1)[..., None]  # as (batch, 1, heads, dim), (batch, heads, 1)
    else:
        out, lse = flashattn2.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                      learnable_sink=sink, return_softmax_lse=True,
                                                      num_splits=num_splits)
    for b, n in enumerate(lens):
        seq = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
        ref, ref_lse = attention_ref(*seq, learnable_sink=sink.double())
        pt, _ = attention_ref(*seq, upcast=False, learnable_sink=sink.to(q.dtype))
        assert_close_to_ref("out", out[b:b + 1], ref, pt, FWD_FACTOR)
        torch.testing.assert_close(lse[b:b + 1].double(), ref_lse, rtol=1e-4, atol=1e-4)


def test_rows_without_keys_put_all_weight_on_the_sink():
    # causal with more queries than keys (bottom-right aligned): the first 8 rows see no key: out 0 and lse
    # equal to the sink, gradients finite
    torch.manual_seed(4)
    q = randn(1, 16, 2, 32, dtype=torch.bfloat16, requires_grad=True)
    k, v = (randn(1, 8, 2, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    sink = torch.tensor([0.25, -1.0], device=DEVICE, requires_grad=True)
    out, lse, _ = flashattn2.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, return_attn_probs=True)
    out.backward(torch.ones_like(out))
    assert torch.equal(out[0, :8], torch.zeros_like(out[0, :8]))
    torch.testing.assert_close(lse[0, :, :8], sink.detach().view(2, 1).expand(2, 8))
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v, sink))


def test_sink_errors_name_the_problem():
    q, k, v = (randn(1, 8, 2, 32, dtype=torch.float16) for _ in range(3))
    with pytest.raises(ValueError, match="learnable_sink must have shape"):
        flashattn2.flash_attn_func(q, k, v, learnable_sink=torch.zeros(3, device=DEVICE))
    with pytest.raises(TypeError, match="learnable_sink must be float32"):
        flashattn2.flash_attn_func(q, k, v, learnable_sink=torch.zeros(2, device=DEVICE, dtype=torch.float64))
    with pytest.raises(NotImplementedError, match="dropout"):
        flashattn2.flash_attn_func(q, k, v, dropout_p=0.1, learnable_sink=torch.zeros(2, device=DEVICE))
    # a KV-cache call with a bad sink raises before it appends the new keys: the cache is left as it was
    k_cache, v_cache = (randn(1, 32, 2, 32, dtype=torch.float16) for _ in range(2))
    before = k_cache.clone()
    with pytest.raises(ValueError, match="learnable_sink must have shape"):
        flashattn2.flash_attn_with_kvcache(q[:, :1], k_cache, v_cache, k[:, :1], v[:, :1], cache_seqlens=4,
                                           learnable_sink=torch.zeros(3, device=DEVICE))
    assert torch.equal(k_cache, before)


def test_sink_under_torch_compile_matches_eager():
    # fullgraph compile (the custom ops and the fold in torch ops): one graph, no break; out and gradients equal
    # the eager call's (which folds in a kernel), the sink's up to summation order
    torch.manual_seed(5)
    q = randn(1, 40, 2, 32, dtype=torch.bfloat16, requires_grad=True)
    k, v = (randn(1, 40, 2, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    sink = torch.randn(2, device=DEVICE, requires_grad=True)

    def attend(q, k, v, sink):
        return flashattn2.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)

    compiled = compiled_in_one_graph(attend, q, k, v, sink)
    results = []
    for fn in (compiled, attend):
        for x in (q, k, v, sink):
            x.grad = None
        out = fn(q, k, v, sink)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), *(x.grad.clone() for x in (q, k, v, sink))))
    for name, a, b in zip(("out", "dq", "dk", "dv", "dsink"), *results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2, msg=lambda m, name=name: f"{name}: {m}")
