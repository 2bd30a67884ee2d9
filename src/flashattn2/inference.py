"""The inference half of the API. So far: flash_attn_combine (FlashAttention-3's), the merge of attention
computed over disjoint parts of the keys: the building block of split-KV decoding and of context
parallelism."""

import contextlib

import torch

from .kernels import combine as combine_kernels
from .kernels.common import INTERPRET

_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 512


def _check_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out: torch.Tensor | None,
                   out_dtype: torch.dtype | None) -> torch.dtype:
    if not isinstance(out_partial, torch.Tensor) or not isinstance(lse_partial, torch.Tensor):
        raise TypeError("out_partial and lse_partial must be tensors")
    if out_partial.dim() != 5:
        raise ValueError("out_partial must be (num_splits, batch, seqlen, nheads, headdim), "
                         f"got shape {tuple(out_partial.shape)}")
    if lse_partial.shape != out_partial.shape[:4]:
        raise ValueError(f"lse_partial must be (num_splits, batch, seqlen, nheads) = {tuple(out_partial.shape[:4])}, "
                         f"got {tuple(lse_partial.shape)}")
    if out_partial.dtype != torch.float32 or lse_partial.dtype != torch.float32:
        raise TypeError(f"out_partial and lse_partial must be float32, got {out_partial.dtype} and {lse_partial.dtype}")
    if out_partial.device != lse_partial.device:
        raise ValueError(f"out_partial and lse_partial are on different devices: {out_partial.device}, "
                         f"{lse_partial.device}")
    if not out_partial.is_cuda and not INTERPRET:
        raise ValueError("flash_attn_combine needs CUDA tensors (CPU tensors only under TRITON_INTERPRET=1)")
    if out_partial.shape[-1] > _MAX_HEAD_DIM:
        raise ValueError(f"head dim {out_partial.shape[-1]} above {_MAX_HEAD_DIM}")
    dtype = out_dtype if out_dtype is not None else (out.dtype if out is not None else out_partial.dtype)
    if dtype not in _OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {_OUT_DTYPES}, got {dtype}")
    if out is not None:
        if out.shape != out_partial.shape[1:]:
            raise ValueError(f"out must be (batch, seqlen, nheads, headdim) = {tuple(out_partial.shape[1:])}, "
                             f"got {tuple(out.shape)}")
        if out.dtype != dtype:
            raise TypeError(f"out has dtype {out.dtype}, but out_dtype is {dtype}")
        if out.device != out_partial.device:
            raise ValueError(f"out is on {out.device}, out_partial on {out_partial.device}")
        if out.stride(-1) != 1:
            raise ValueError("out must have a contiguous last dimension")
    return dtype


def flash_attn_combine(
    out_partial: torch.Tensor,
    lse_partial: torch.Tensor,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge attention outputs computed over disjoint parts of the keys (FlashAttention-3's combine).

    Arguments:
        out_partial: (num_splits, batch_size, seqlen, nheads, headdim), float32: each part's normalised output.
        lse_partial: (num_splits, batch_size, seqlen, nheads), float32: each part's logsumexp (natural log).
            A part with lse -inf saw no key and weighs nothing; +inf (what flash_attn_func returns for a
            row that sees no key) counts as empty too.
        out: optional (batch_size, seqlen, nheads, headdim) tensor to write the result into.
        out_dtype: float32 (default: out_partial's dtype), float16 or bfloat16.
    Return:
        out: (batch_size, seqlen, nheads, headdim) in out_dtype; 0 where every part is empty.
        softmax_lse: (batch_size, seqlen, nheads), float32; -inf where every part is empty.
    """
    dtype = _check_combine(out_partial, lse_partial, out, out_dtype)
    if out_partial.stride(-1) != 1:
        out_partial = out_partial.contiguous()
    _, batch, seqlen, nheads, head_dim = out_partial.shape
    if out is None:
        out = torch.empty((batch, seqlen, nheads, head_dim), dtype=dtype, device=out_partial.device)
    # stored (batch, nheads, seqlen) like the attention functions' lse, returned as FA3's (batch, seqlen, nheads)
    lse = torch.empty((batch, nheads, seqlen), dtype=torch.float32, device=out_partial.device).transpose(1, 2)
    with torch.cuda.device(out_partial.device) if out_partial.is_cuda else contextlib.nullcontext():
        combine_kernels.combine(out_partial, lse_partial, out, lse)
    return out, lse

