"""The flash_attn-compatible API: argument checks, layouts, and the torch.library ops with autograd.

The kernels run behind two custom ops (flashattn2::fwd and flashattn2::bwd) so that autograd and
torch.compile see one opaque node each, with fake implementations for tracing.
"""

import math
from collections.abc import Sequence

import torch

from .kernels.backward import attention_backward
from .kernels.common import INTERPRET
from .kernels.forward import attention_forward

MAX_HEAD_DIM = 256
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
# Row offsets inside the kernels are 32-bit: seqlen * row stride must stay below this.
_MAX_ROW_OFFSET = 2**31


# ----------------------------------------------------------------------------------------------
# custom ops


@torch.library.custom_op("flashattn2::fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool,
            deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # deterministic is unused here; it rides along so the backward can read it from the inputs
    return attention_forward(q, k, v, softmax_scale, causal)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, softmax_scale, causal, deterministic):
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    return out, lse


@torch.library.custom_op("flashattn2::bwd", mutates_args=())
def _bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, softmax_scale: float, causal: bool, deterministic: bool,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return attention_backward(dout, q, k, v, out, lse, softmax_scale, causal, deterministic)


@_bwd_op.register_fake
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, deterministic):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale, ctx.causal, ctx.deterministic = softmax_scale, causal, deterministic
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    # the kernels need a unit stride on the head dim; upstream ops may hand any layout
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = _bwd_op(dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.deterministic)
    return dq, dk, dv, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------------
# argument checks


def _check_unsupported(dropout_p: float, window_size: Sequence[int], softcap: float,
                       alibi_slopes: torch.Tensor | None) -> None:
    """Options that belong to a later release: refuse them by name rather than ignore them."""
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p} is not supported yet: only dropout_p=0.0")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError(f"window_size={tuple(window_size)} is not supported yet: only (-1, -1)")
    if softcap != 0.0:
        raise NotImplementedError(f"softcap={softcap} is not supported yet: only softcap=0.0")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes is not supported yet: pass alibi_slopes=None")


def _unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    # any layout works as long as the head dim is contiguous; copy only when it is not
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Validate q, k, v of shape (batch, seqlen, nheads, headdim); returns them and the scale."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (batch, seqlen, nheads, headdim), "
                             f"got shape {tuple(x.shape)}")
    if q.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"flashattn2 supports float16 and bfloat16 inputs, got q.dtype={q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device} and {v.device}")
    if q.device.type == "cpu":
        if not INTERPRET:
            raise ValueError("CPU tensors run only through the Triton interpreter: set TRITON_INTERPRET=1 "
                             "before importing flashattn2, or move the tensors to a CUDA device")
    elif q.device.type != "cuda":
        raise ValueError(f"flashattn2 runs on CUDA devices (or the CPU interpreter), got {q.device}")

    batch, seqlen_q, nheads, head_dim = q.shape
    _, seqlen_k, nheads_k, _ = k.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"batch sizes differ: q {batch}, k {k.shape[0]}, v {v.shape[0]}")
    if v.shape[1] != seqlen_k:
        raise ValueError(f"k and v must have the same seqlen, got {seqlen_k} and {v.shape[1]}")
    if v.shape[2] != nheads_k:
        raise ValueError(f"k and v must have the same number of heads, got {nheads_k} and {v.shape[2]}")
    if k.shape[3] != head_dim or v.shape[3] != head_dim:
        raise ValueError(f"head dims differ: q {head_dim}, k {k.shape[3]}, v {v.shape[3]}")
    if head_dim > MAX_HEAD_DIM or head_dim < 1:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"the number of query heads ({nheads}) must be divisible by the number of "
                         f"key/value heads ({nheads_k})")

    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    else:
        softmax_scale = float(softmax_scale)
        if not (math.isfinite(softmax_scale) and softmax_scale > 0.0):
            raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale}")

    q, k, v = _unit_last_stride(q), _unit_last_stride(k), _unit_last_stride(v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.shape[1] * x.stride(1) >= _MAX_ROW_OFFSET:
            raise ValueError(f"{name} is too large: seqlen * row stride must stay below 2**31 elements")
    return q, k, v, softmax_scale


# ----------------------------------------------------------------------------------------------
# public API (flash_attn 2.x names, argument order, defaults and return values)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """dropout_p should be set to 0.0 during evaluation
    Supports multi-query and grouped-query attention (MQA/GQA) by passing in KV with fewer heads
    than Q. Note that the number of heads in Q must be divisible by the number of heads in KV.
    For example, if Q has 6 heads and K, V have 2 heads, head 0, 1, 2 of Q will attention to head
    0 of K, V, and head 3, 4, 5 of Q will attention to head 1 of K, V.

    If causal=True, the causal mask is aligned to the bottom right corner of the attention matrix.
    For example, if seqlen_q = 2 and seqlen_k = 5, the causal mask (1 = keep, 0 = masked out) is:
        1 1 1 1 0
        1 1 1 1 1
    If seqlen_q = 5 and seqlen_k = 2, the causal mask is:
        0 0
        0 0
        0 0
        1 0
        1 1
    If the row of the mask is all zero, the output will be zero.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim)
        k: (batch_size, seqlen, nheads_k, headdim)
        v: (batch_size, seqlen, nheads_k, headdim)
        dropout_p: float. Dropout probability. Only 0.0 is supported in this release.
        softmax_scale: float. The scaling of QK^T before applying softmax.
            Default to 1 / sqrt(headdim).
        causal: bool. Whether to apply causal attention mask (e.g., for auto-regressive modeling).
        window_size: (left, right). Only (-1, -1) (no sliding window) is supported in this release.
        softcap: float. Only 0.0 (no softcapping) is supported in this release.
        alibi_slopes: Only None is supported in this release.
        deterministic: bool. Whether to use the deterministic implementation of the backward pass,
            which is slightly slower and uses no atomic adds.
        return_attn_probs: bool. Whether to return the attention probabilities. This option is for
           testing only. The returned probabilities are not guaranteed to be correct
           (they might not have the right scaling).
    Return:
        out: (batch_size, seqlen, nheads, headdim).
        softmax_lse [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen). The
            logsumexp of each row of the matrix QK^T * scaling (e.g., log of the softmax
            normalization factor).
        S_dmask [optional, if return_attn_probs=True]: None while dropout is unsupported (flash_attn
            returns the dropout mask only when dropout_p > 0).
    """
    _check_unsupported(dropout_p, window_size, softcap, alibi_slopes)
    q, k, v, softmax_scale = _check_qkv(q, k, v, softmax_scale)
    out, lse = _fwd_op(q, k, v, softmax_scale, bool(causal), bool(deterministic))
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """dropout_p should be set to 0.0 during evaluation
    If Q, K, V are already stacked into 1 tensor, this function will be faster than
    calling flash_attn_func on Q, K, V since the backward pass avoids explicit concatenation
    of the gradients of Q, K, V.
    For multi-query and grouped-query attention (MQA/GQA), please see
    flash_attn_kvpacked_func and flash_attn_func.

    Arguments:
        qkv: (batch_size, seqlen, 3, nheads, headdim)
        Other arguments and the return values are those of flash_attn_func.
    """
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must have shape (batch, seqlen, 3, nheads, headdim), got {tuple(qkv.shape)}")
    q, k, v = qkv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """dropout_p should be set to 0.0 during evaluation
    If K, V are already stacked into 1 tensor, this function will be faster than
    calling flash_attn_func on Q, K, V since the backward pass avoids explicit concatenation
    of the gradients of K, V.
    Supports multi-query and grouped-query attention (MQA/GQA) by passing in KV with fewer heads
    than Q. Note that the number of heads in Q must be divisible by the number of heads in KV.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim)
        kv: (batch_size, seqlen, 2, nheads_k, headdim)
        Other arguments and the return values are those of flash_attn_func.
    """
    if not isinstance(kv, torch.Tensor):
        raise TypeError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv must have shape (batch, seqlen, 2, nheads_k, headdim), got {tuple(kv.shape)}")
    k, v = kv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)
