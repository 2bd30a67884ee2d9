"""flash_attn_combine: the merge of attention over disjoint parts of the keys, checked against a float64
merge and against attention over the whole key set (CPU under the interpreter, and the GPU)."""

import pytest
import torch

from flashattn2 import attention_ref, flash_attn_combine, flash_attn_func
from helpers import DEVICE, FWD_FACTOR, assert_close_to_ref, randn


def _merge64(out_partial, lse_partial):
    """The float64 merge, empty parts (lse +-inf) weighing nothing."""
    lse = lse_partial.double().masked_fill(torch.isinf(lse_partial), float("-inf"))
    total = torch.logsumexp(lse, dim=0)
    weights = torch.exp(lse - total.masked_fill(torch.isinf(total), 0.0)).nan_to_num(0.0)
    out = (weights[..., None] * out_partial.double().nan_to_num(0.0)).sum(0)
    return out, total


def _partials(splits, batch, seqlen, nheads, head_dim, generator=None):
    out_partial = torch.randn(splits, batch, seqlen, nheads, head_dim, device=DEVICE, generator=generator)
    lse_partial = torch.randn(splits, batch, seqlen, nheads, device=DEVICE, generator=generator) * 3
    return out_partial, lse_partial


@pytest.mark.parametrize("splits,batch,seqlen,nheads,head_dim", [
    (1, 1, 1, 1, 8), (3, 2, 17, 3, 64), (5, 1, 33, 2, 100), (2, 3, 5, 4, 256),
])
def test_combine_matches_float64_merge(splits, batch, seqlen, nheads, head_dim):
    torch.manual_seed(splits * 7 + seqlen)
    out_partial, lse_partial = _partials(splits, batch, seqlen, nheads, head_dim)
    out, lse = flash_attn_combine(out_partial, lse_partial)
    ref_out, ref_lse = _merge64(out_partial, lse_partial)
    assert out.shape == (batch, seqlen, nheads, head_dim) and out.dtype == torch.float32
    assert lse.shape == (batch, seqlen, nheads) and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


def test_empty_parts_weigh_nothing_and_empty_rows_are_neutral():
    torch.manual_seed(3)
    out_partial, lse_partial = _partials(3, 2, 6, 2, 32)
    lse_partial[0, 0] = float("-inf")       # part 0 empty on batch 0's rows
    out_partial[0, 0] = float("nan")        # and its output is garbage
    lse_partial[1, 1, 2] = float("inf")     # +inf: the attention functions' "no key" counts as empty
    lse_partial[:, 1, 4] = float("-inf")    # every part empty on one row
    out_partial[:, 1, 4] = float("nan")
    out, lse = flash_attn_combine(out_partial, lse_partial)
    ref_out, ref_lse = _merge64(out_partial, lse_partial)
    assert not torch.isnan(out).any()
    assert torch.equal(out[1, 4], torch.zeros_like(out[1, 4]))
    assert torch.isneginf(lse[1, 4]).all()
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
def test_out_dtype_and_out_argument(out_dtype):
    torch.manual_seed(4)
    out_partial, lse_partial = _partials(2, 1, 9, 2, 64)
    ref_out, _ = _merge64(out_partial, lse_partial)
    out, _ = flash_attn_combine(out_partial, lse_partial, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-2, atol=1e-2)
    given = torch.full((1, 9, 2, 64), float("nan"), dtype=out_dtype, device=DEVICE)
    result, _ = flash_attn_combine(out_partial, lse_partial, out=given)
    assert result is given and torch.equal(given, out)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_over_key_chunks_combines_to_full_attention(causal):
    """Split the keys in three, attend to each chunk (causal: each chunk's mask is the full mask's slice,
    expressed as a window), merge: the result is attention over all keys."""
    torch.manual_seed(5)
    dtype = torch.float16
    q = randn(2, 40, 4, 64, dtype=dtype)
    k = randn(2, 96, 2, 64, dtype=dtype)
    v = randn(2, 96, 2, 64, dtype=dtype)
    full, full_lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    outs, lses = [], []
    seqlen_k = k.shape[1]
    for lo, hi in ((0, 30), (30, 61), (61, 96)):
        # query i sees keys j <= i + seqlen_k - seqlen_q; against the chunk's own bottom-right diagonal
        # (i + hi - lo - seqlen_q, in chunk positions) that is a right window edge of seqlen_k - hi
        right = seqlen_k - hi if causal else -1
        out, lse, _ = flash_attn_func(q, k[:, lo:hi], v[:, lo:hi], window_size=(-1, right),
                                      return_attn_probs=True)
        outs.append(out.float())
        lses.append(lse.transpose(1, 2))  # (batch, nheads, seqlen) -> (batch, seqlen, nheads)
    out, lse = flash_attn_combine(torch.stack(outs), torch.stack(lses).contiguous(), out_dtype=dtype)
    ref, _ = attention_ref(q, k, v, causal=causal)  # float64
    pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)  # PyTorch in fp16
    # each chunk's output is rounded to fp16 once before the merge rounds again: one rounding more than
    # the one-shot kernel, hence the pass rule's factor plus one
    assert_close_to_ref("combined out", out, ref, pt, FWD_FACTOR + 1.0)
    assert_close_to_ref("one-shot out", full, ref, pt, FWD_FACTOR)
    torch.testing.assert_close(lse.transpose(1, 2), full_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("change,error,match", [
    (lambda o, lse: (o[0], lse), ValueError, "out_partial must be"),
    (lambda o, lse: (o, lse[..., :1]), ValueError, "lse_partial must be"),
    (lambda o, lse: (o.half(), lse), TypeError, "must be float32"),
    (lambda o, lse: (o, lse.double()), TypeError, "must be float32"),
])
def test_bad_inputs_raise_named_errors(change, error, match):
    out_partial, lse_partial = _partials(2, 1, 3, 2, 16)
    with pytest.raises(error, match=match):
        flash_attn_combine(*change(out_partial, lse_partial))
    with pytest.raises(TypeError, match="out_dtype must be"):
        flash_attn_combine(out_partial, lse_partial, out_dtype=torch.float64)
    with pytest.raises(ValueError, match="out must be"):
        flash_attn_combine(out_partial, lse_partial, out=torch.empty(1, 3, 2, 8, device=DEVICE))
