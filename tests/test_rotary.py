"""apply_rotary_emb (flash_attn's signature) against a float64 rotation, forward and backward, dense and
packed, with per-sequence offsets and positions past the tables (CPU under the interpreter, and the GPU)."""

import pytest
import torch

from flashattn2 import apply_rotary_emb
from helpers import DEVICE, randn


def _rotary_ref(x, cos, sin, interleaved, offsets, lengths=None):
    """float64 rotation of the first 2 * cos.shape[1] channels; rows past the tables pass through."""
    x = x.double()
    half = cos.shape[1]
    if lengths is None:  # dense: (batch, seqlen, heads, dim)
        batch, seqlen = x.shape[:2]
        pos = torch.arange(seqlen, device=x.device)[None, :] + offsets.view(-1, 1)
    else:  # packed: (total, heads, dim), one sequence after another
        pos = torch.cat([torch.arange(n, device=x.device) + int(o)
                         for n, o in zip(lengths, offsets.tolist(), strict=True)])
    inside = (pos >= 0) & (pos < cos.shape[0])
    idx = pos.clamp(0, cos.shape[0] - 1)
    c = torch.where(inside[..., None], cos.double()[idx], 1.0)[..., None, :]
    s = torch.where(inside[..., None], sin.double()[idx], 0.0)[..., None, :]
    out = x.clone()
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        x1, x2 = x[..., :half], x[..., half:2 * half]
        out[..., :half], out[..., half:2 * half] = x1 * c - x2 * s, x1 * s + x2 * c
    return out


def _tables(seqlen_ro, rotary_dim, dtype):
    angle = torch.rand(seqlen_ro, rotary_dim // 2, device=DEVICE) * 6.28
    return angle.cos().to(dtype), angle.sin().to(dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rotary_dim,head_dim", [(64, 64), (32, 80)])
def test_dense_forward_and_backward(interleaved, dtype, rotary_dim, head_dim):
    torch.manual_seed(rotary_dim + head_dim + interleaved)
    x = randn(3, 37, 2, head_dim, dtype=dtype, requires_grad=True)
    cos, sin = _tables(40, rotary_dim, dtype)
    offsets = torch.tensor([0, 2, 30], dtype=torch.int32, device=DEVICE)  # the last runs past the tables
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    ref = _rotary_ref(x.detach(), cos, sin, interleaved, offsets)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    dout = randn(*out.shape, dtype=dtype)
    out.backward(dout)
    # the rotation is orthogonal: the gradient is dout rotated back
    angle_back = _rotary_ref(dout, cos, -sin, interleaved, offsets)
    torch.testing.assert_close(x.grad.double(), angle_back, rtol=tol, atol=tol)


def test_int_offset_inplace_and_packed():
    torch.manual_seed(1)
    cos, sin = _tables(64, 32, torch.float16)
    x = randn(2, 20, 3, 32, dtype=torch.float16)
    ref = _rotary_ref(x, cos, sin, False, torch.tensor([5, 5], device=DEVICE))
    y = x.clone()
    result = apply_rotary_emb(y, cos, sin, inplace=True, seqlen_offsets=5)
    assert result.data_ptr() == y.data_ptr()
    torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2)
    lengths = [7, 0, 13]
    packed = randn(sum(lengths), 3, 32, dtype=torch.float16)
    cu = torch.tensor([0, 7, 7, 20], dtype=torch.int32, device=DEVICE)
    offsets = torch.tensor([1, 4, 50], dtype=torch.int32, device=DEVICE)
    out = apply_rotary_emb(packed, cos, sin, interleaved=True, seqlen_offsets=offsets, cu_seqlens=cu,
                           max_seqlen=13)
    torch.testing.assert_close(out.double(), _rotary_ref(packed, cos, sin, True, offsets, lengths),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(x=(2, 4, 64)), ValueError, "must be \\(batch, seqlen"),
    (dict(cos=(8, 48)), ValueError, "exceeds headdim"),
    (dict(offsets=torch.zeros(3, dtype=torch.int32)), ValueError, "seqlen_offsets must be"),
    (dict(sin=(8, 8)), ValueError, "cos and sin must both be"),
])
def test_bad_inputs_raise_named_errors(kwargs, error, match):
    x = randn(*kwargs.get("x", (2, 4, 1, 64)), dtype=torch.float16)
    cos = torch.ones(*kwargs.get("cos", (8, 16)), device=DEVICE, dtype=torch.float16)
    sin = torch.zeros(*kwargs.get("sin", cos.shape), device=DEVICE, dtype=torch.float16)
    offsets = kwargs.get("offsets", 0)
    if isinstance(offsets, torch.Tensor):
        offsets = offsets.to(DEVICE)
    with pytest.raises(error, match=match):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets)
