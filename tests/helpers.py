"""Shared test helpers: random inputs, the flash_attn pass rule, and the device the suite runs on."""

import torch

from flashattn2.reference import attention_ref, within_tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"

# flash_attn's rule: our max error against the float64 oracle is at most FACTOR x the error of PyTorch
# doing the same math in the input dtype, plus a small absolute floor for exactly representable cases.
FWD_FACTOR = 2.0
BWD_FACTOR = 3.0
ABS_FLOOR = 1e-5


def randn(*shape, dtype, device=DEVICE, requires_grad=False, generator=None) -> torch.Tensor:
    x = torch.randn(*shape, dtype=torch.float32, device=device, generator=generator).to(dtype)
    return x.requires_grad_(requires_grad)


def assert_close_to_ref(name: str, ours: torch.Tensor, ref: torch.Tensor, pt: torch.Tensor, factor: float,
                        where: torch.Tensor | None = None) -> None:
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(ours).any(), f"{name}: NaN in output (an element was never written?)"
    passed, err, pt_err = within_tolerance(ours, ref, pt, factor, ABS_FLOOR, where)
    assert passed, (
        f"{name}: max error {err:.3e} > {factor} x PyTorch's {pt_err:.3e} + {ABS_FLOOR}")


def reference_with_grads(q, k, v, dout, causal, softmax_scale=None, upcast=True):
    """Reference out, lse and (dq, dk, dv), in float64 (upcast) or in the input dtype."""
    # float64 leaves for the oracle, so its gradients are not rounded back to the input dtype
    leaves = [(x.detach().double() if upcast else x.detach().clone()).requires_grad_() for x in (q, k, v)]
    out, lse = attention_ref(*leaves, softmax_scale=softmax_scale, causal=causal, upcast=upcast)
    out.backward(dout.to(out.dtype))
    return out.detach(), lse.detach(), tuple(x.grad for x in leaves)


def check_attention(q, k, v, out, lse, grads, dout, causal, softmax_scale=None) -> None:
    """Apply the pass rule to out, lse and (if given) the gradients against float64 and in-dtype refs."""
    ref_out, ref_lse, ref_grads = reference_with_grads(q, k, v, dout, causal, softmax_scale, upcast=True)
    pt_out, pt_lse, pt_grads = reference_with_grads(q, k, v, dout, causal, softmax_scale, upcast=False)
    assert_close_to_ref("out", out, ref_out, pt_out, FWD_FACTOR)
    # lse: +inf exactly where a row sees no key, and close elsewhere
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse > 0), empty), "lse must be +inf exactly on rows seeing no key"
    assert_close_to_ref("lse", lse, ref_lse, pt_lse, FWD_FACTOR, where=~empty)
    if grads is not None:
        for name, g, rg, pg in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads, strict=True):
            assert_close_to_ref(name, g, rg, pg, BWD_FACTOR)
