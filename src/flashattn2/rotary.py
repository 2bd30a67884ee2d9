"""apply_rotary_emb with flash_attn's signature (flash_attn.layers.rotary), with autograd: the rotation
the KV-cache API applies to queries and new keys, usable on its own."""

import torch

from .checks import check_rotary
from .kernels.portable import rotary as rotary_kernels


def rotate(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen, conjugate):
    """The rotation on checked inputs, without autograd (the KV-cache path calls it directly)."""
    rotary_dim = 2 * cos.shape[1]
    if x.stride(-1) != 1:  # a gradient may come in any layout
        x = x.contiguous()
    if inplace:
        out = x
    else:
        out = torch.empty_like(x)
        if rotary_dim < x.shape[-1]:
            out[..., rotary_dim:] = x[..., rotary_dim:]
    rotary_kernels.rotary(x, out, cos.contiguous(), sin.contiguous(), interleaved, seqlen_offsets, cu_seqlens,
                          max_seqlen, conjugate)
    return out


class _ApplyRotaryEmb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen):
        out = rotate(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen, False)
        tensors = (cos, sin, cu_seqlens) + ((seqlen_offsets,) if isinstance(seqlen_offsets, torch.Tensor) else ())
        ctx.save_for_backward(*[t for t in tensors if t is not None])
        ctx.has_cu = cu_seqlens is not None
        ctx.offsets = None if isinstance(seqlen_offsets, torch.Tensor) else seqlen_offsets
        ctx.interleaved, ctx.inplace, ctx.max_seqlen = interleaved, inplace, max_seqlen
        if inplace:
            ctx.mark_dirty(x)
            return x
        return out

    @staticmethod
    def backward(ctx, dout):
        saved = list(ctx.saved_tensors)
        cos, sin = saved[0], saved[1]
        rest = saved[2:]
        cu_seqlens = rest.pop(0) if ctx.has_cu else None
        offsets = rest.pop(0) if ctx.offsets is None else ctx.offsets
        # the gradient of a rotation is the inverse rotation
        dx = rotate(dout, cos, sin, ctx.interleaved, False, offsets, cu_seqlens, ctx.max_seqlen, True)
        return dx, None, None, None, None, None, None, None


def apply_rotary_emb(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """
    Arguments:
        x: (batch_size, seqlen, nheads, headdim) if cu_seqlens is None
            else (total_seqlen, nheads, headdim)
        cos, sin: (seqlen_rotary, rotary_dim / 2)
        interleaved: if True, rotate pairs of even and odd dimensions (GPT-J style) instead
            of 1st half and 2nd half (GPT-NeoX style).
        inplace: if True, apply rotary embedding in-place.
        seqlen_offsets: (batch_size,) or int. Each sequence in x is shifted by this amount.
            Most commonly used in inference when we have KV cache.
        cu_seqlens: (batch + 1,) or None
        max_seqlen: int
    Return:
        out: (batch_size, seqlen, nheads, headdim) if cu_seqlens is None
            else (total_seqlen, nheads, headdim)
    rotary_dim must be <= headdim
    Apply rotary embedding to the first rotary_dim of x. Positions past seqlen_rotary are left as they are.
    """
    check_rotary(x, cos, sin, seqlen_offsets, cu_seqlens, max_seqlen)
    return _ApplyRotaryEmb.apply(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen)
