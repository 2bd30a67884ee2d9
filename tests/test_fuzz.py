"""The seeded fuzzer (scripts/fuzz.py) in CI's size: random valid cases against float64 by flash_attn's rule, and
random bad arguments that must each raise a named error. Failures print one reproducer line each."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))

import fuzz  # noqa: E402


def test_fuzz_valid_cases():
    failures, _ = fuzz.run_cases(seed=0, cases=16, mode="valid", max_len=100)
    assert not failures, "\n".join(failures)


def test_fuzz_invalid_arguments_raise_named_errors():
    # 17 kinds of bad argument over 300 draws; removing the softcap check fails this
    failures, _ = fuzz.run_cases(seed=0, cases=300, mode="invalid", max_len=100)
    assert not failures, "\n".join(failures)


def test_delta_baseline_is_the_backward_with_delta_from_the_rounded_out():
    # the fuzzer's second baseline for gradients: float64 attention whose dS takes Delta' = rowsum(dO o out) from a
    # given (rounded) out; written out by hand here, and equal to the reference's gradients when out is exact
    import functools

    import torch

    from flashattn2.reference import attention_ref

    torch.manual_seed(0)
    batch, seqlen_q, seqlen_k, heads, head_dim = 2, 7, 9, 2, 5
    q, do = (torch.randn(batch, seqlen_q, heads, head_dim, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(batch, seqlen_k, heads, head_dim, dtype=torch.float64) for _ in range(2))
    reference = functools.partial(attention_ref, causal=True)
    exact, _ = reference(q, k, v)
    rounded = exact + 1e-2 * torch.randn_like(exact)
    scale = head_dim ** -0.5
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool).tril(seqlen_k - seqlen_q)
    p = scores.masked_fill(~keep, float("-inf")).softmax(-1)
    delta = (do * rounded).sum(-1).transpose(1, 2)[..., None]
    ds = p * (torch.einsum("bqhd,bkhd->bhqk", do, v) - delta)
    by_hand = (torch.einsum("bhqk,bkhd->bqhd", ds, k) * scale, torch.einsum("bhqk,bqhd->bkhd", ds, q) * scale,
               torch.einsum("bhqk,bqhd->bkhd", p, do))
    for ours, want in zip(fuzz._delta_grads(reference, (q, k, v), do, rounded), by_hand, strict=True):
        torch.testing.assert_close(ours, want, rtol=0, atol=1e-12)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    reference(*xs)[0].backward(do)
    for ours, x in zip(fuzz._delta_grads(reference, (q, k, v), do, exact), xs, strict=True):
        torch.testing.assert_close(ours, x.grad, rtol=0, atol=1e-12)


def test_kvcache_outputs_are_judged_by_flash_attn_kvcache_rule():
    # flash_attn's test_flash_attn_kvcache passes out within 3x PyTorch's error + 1e-5, as tests/test_kvcache.py; the
    # fuzzer's kvcache and latent cases take the same factor, and it still fails a wrong answer
    import pytest
    import torch

    from test_kvcache import FACTOR

    assert fuzz.KVCACHE == FACTOR
    torch.manual_seed(0)
    ref = torch.randn(1, 4, 2, 8, dtype=torch.float64)
    pt = ref.to(torch.bfloat16)
    pt_err = (pt.double() - ref).abs().max().item()
    close = ref + 2.5 * pt_err * torch.sign(torch.randn_like(ref))  # past 2x PyTorch's error, within 3x
    fuzz._compare("", close, (), (ref,), (pt,), fwd=fuzz.KVCACHE)
    with pytest.raises(AssertionError, match="out: error"):
        fuzz._compare("", close, (), (ref,), (pt,))  # the 2x rule of the other calls
    wrong = pt.clone()
    wrong[0, 0, 0, 0] += 0.05
    with pytest.raises(AssertionError, match="out: error"):
        fuzz._compare("", wrong, (), (ref,), (pt,), fwd=fuzz.KVCACHE)


def test_the_rule_is_flash_attn_of_either_generation(monkeypatch):
    # an output one rounding off where PyTorch's is exact (head dim 1's coin toss): FA2's rule (2x PyTorch's error +
    # 1e-5) fails it, FA3/FA4's (2x + 2 roundings of ref + 0.3) passes it and the case is listed as lenient; a wrong
    # answer fails both, and --rule fa2 fails the first too
    import pytest
    import torch

    ulp = 2.0 ** -13  # bf16's at 0.0302
    pt = torch.tensor([[0.0302, -0.0078]]).to(torch.bfloat16)
    ref = pt.double() + 0.05 * ulp  # PyTorch's error a twentieth of an ulp
    ulp_off = pt.clone()
    ulp_off[0, 0] += ulp
    monkeypatch.setattr(fuzz, "LENIENT", [])
    fuzz._compare("", ulp_off, (), (ref,), (pt,))
    assert len(fuzz.LENIENT) == 1 and "FA3/FA4's rule" in fuzz.LENIENT[0]
    wrong = pt.clone()
    wrong[0, 0] += 0.05
    with pytest.raises(AssertionError, match=r"out: error .*rounding allowance .*: no\)"):
        fuzz._compare("", wrong, (), (ref,), (pt,))
    monkeypatch.setattr(fuzz, "RULE", "fa2")
    with pytest.raises(AssertionError, match=r"out: error .*: yes\)"):
        fuzz._compare("", ulp_off, (), (ref,), (pt,))


def test_a_flex_check_passes_within_the_factor_of_pytorchs_flexattention(monkeypatch):
    # flex_attention's gradients: PyTorch's own FlexAttention in the input dtype is the other "PyTorch doing the same
    # math" (its Delta from the rounded out too); a gradient within 3x of its error passes, listed as lenient; one
    # past both fails, naming both errors; --rule fa2 does not ask the peer
    import pytest
    import torch

    gen = torch.Generator().manual_seed(5)
    ref = [torch.randn(2, 3, 4, 8, generator=gen, dtype=torch.float64) for _ in range(4)]
    noise = [torch.randn(2, 3, 4, 8, generator=gen, dtype=torch.float64) for _ in range(4)]
    pt = [r + 1e-4 * n for r, n in zip(ref, noise, strict=True)]  # PyTorch eager, close
    ours = [r + 2e-3 * n for r, n in zip(ref, noise, strict=True)]
    ours[0] = pt[0]  # the output passes; the gradients are 20x PyTorch eager's error
    peer_off = [r + 1e-3 * n for r, n in zip(ref, noise, strict=True)]  # the peer's error half of ours
    peer_close = pt
    monkeypatch.setattr(fuzz, "LENIENT", [])
    fuzz._compare("", ours[0], ours[1:], ref, pt, peer=lambda: peer_off)
    assert len(fuzz.LENIENT) == 3 and all("FlexAttention: error" in m and "yes" in m for m in fuzz.LENIENT)
    with pytest.raises(AssertionError, match=r"dq: error .*FlexAttention: error .*within 3.0 x: no\)"):
        fuzz._compare("", ours[0], ours[1:], ref, pt, peer=lambda: peer_close)
    asked = []
    monkeypatch.setattr(fuzz, "RULE", "fa2")
    with pytest.raises(AssertionError, match=r"dq: error"):
        fuzz._compare("", ours[0], ours[1:], ref, pt, peer=lambda: asked.append(1) or peer_off)
    assert not asked
