"""flashattn2.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention: PyTorch's
layout and semantics (top-left causal), in float64 as the oracle and in the input dtype for the pass rule."""

import pytest
import torch
import torch.nn.functional as F

import flashattn2
from helpers import BWD_FACTOR, FWD_FACTOR, assert_close_to_ref, randn


def _torch_sdpa(q, k, v, upcast, **kw):
    leaves = [(x.detach().double() if upcast else x.detach().clone()).requires_grad_() for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, **kw)
    return out, leaves


@pytest.mark.parametrize("batch,heads,heads_k,seqlen_q,seqlen_k,head_dim,causal,scale", [
    (2, 4, 4, 17, 17, 64, False, None),
    (2, 4, 4, 17, 17, 64, True, None),
    (1, 2, 2, 9, 33, 32, True, None),     # L < S: top-left causal, keys past L never seen
    (1, 2, 2, 40, 13, 64, True, 0.3),     # L > S: every row sees key 0 on
    (2, 8, 2, 16, 24, 64, True, None),    # GQA
])
@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_matches_torch_sdpa(batch, heads, heads_k, seqlen_q, seqlen_k, head_dim, causal, scale, dtype):
    torch.manual_seed(seqlen_q * 31 + seqlen_k)
    # (batch, seqlen, heads, dim) projections viewed as PyTorch's (batch, heads, seqlen, dim): no copy needed
    q = randn(batch, seqlen_q, heads, head_dim, dtype=dtype).transpose(1, 2).requires_grad_()
    k = randn(batch, seqlen_k, heads_k, head_dim, dtype=dtype).transpose(1, 2).requires_grad_()
    v = randn(batch, seqlen_k, heads_k, head_dim, dtype=dtype).transpose(1, 2).requires_grad_()
    kw = dict(is_causal=causal, scale=scale, enable_gqa=heads_k != heads)
    out = flashattn2.scaled_dot_product_attention(q, k, v, **kw)
    assert out.shape == (batch, heads, seqlen_q, head_dim)
    assert out.transpose(1, 2).is_contiguous(), "a view of the kernel's (batch, L, heads, dim) output"
    ref, ref_leaves = _torch_sdpa(q, k, v, True, **kw)
    pt, pt_leaves = _torch_sdpa(q, k, v, False, **kw)
    assert_close_to_ref("out", out, ref, pt, FWD_FACTOR)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.double())
    pt_grads = torch.autograd.grad(pt, pt_leaves, dout)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads, strict=True):
        assert_close_to_ref(name, g, r, p, BWD_FACTOR)


def test_refusals_name_the_problem():
    q = randn(1, 4, 8, 32, dtype=torch.bfloat16)
    k = randn(1, 2, 8, 32, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="is_causal=True.*window_size.*flash_attn_varlen_func"):
        flashattn2.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flashattn2.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match=r"\(batch, heads, seqlen, headdim\)"):
        flashattn2.scaled_dot_product_attention(q[0], q[0], q[0])
