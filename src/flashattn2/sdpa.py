"""scaled_dot_product_attention with PyTorch's signature, layout and semantics, on flashattn2's kernels."""

import torch

from .checks import check_sdpa
from .interface import flash_attn_func


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention's contract, computed by flashattn2.

    Arguments:
        query: (batch, nheads, L, headdim), float16 or bfloat16.
        key, value: (batch, nheads_k, S, headdim); nheads_k < nheads only with enable_gqa=True.
        attn_mask: must be None. Arbitrary masks are not supported: use is_causal, flash_attn_func's
            window_size (sliding windows) or flash_attn_varlen_func (padding, packed sequences).
        dropout_p: dropout probability, applied whenever > 0 (as in PyTorch: pass 0.0 in evaluation).
        is_causal: PyTorch's causal mask, aligned to the top-left corner: query i sees keys j <= i.
            (flash_attn_func's causal=True is aligned to the bottom-right; they differ when L != S.)
        scale: the softmax scale; default 1 / sqrt(headdim).
        enable_gqa: allow key/value with fewer heads than query (grouped-query attention).
    Return:
        (batch, nheads, L, headdim), a transposed view of the kernel's (batch, L, nheads, headdim) output.
    The usual transposed views (e.g. (batch, L, nheads, headdim) projections viewed as (batch, nheads, L,
    headdim)) go to the kernels without a copy.
    """
    check_sdpa(query, key, value, attn_mask, enable_gqa)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    window = (-1, -1)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    if is_causal:
        if seqlen_q <= seqlen_k:
            # top-left causal never reaches keys past L - 1: drop them (a view), then bottom-right = top-left
            k, v = k[:, :seqlen_q], v[:, :seqlen_q]
            window = (-1, 0)
        else:
            # query i sees keys j <= i: a bottom-right window whose right edge sits L - S past the diagonal
            window = (-1, seqlen_q - seqlen_k)
    out = flash_attn_func(q, k, v, dropout_p=dropout_p, softmax_scale=scale, window_size=window)
    return out.transpose(1, 2)
