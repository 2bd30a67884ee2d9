"""flashattn2: FlashAttention-2 as Triton kernels, with the flash_attn 2.x API.

    from flashattn2 import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)  # q, k, v: (batch, seqlen, nheads, headdim)
"""

from .bert_padding import pad_input, unpad_input
from .flex import create_block_mask, flex_attention
from .fp8 import quantize_fp8
from .inference import flash_attn_combine, flash_attn_with_kvcache
from .interface import (
    attention_backend,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    get_backend,
    set_backend,
)
from .reference import attention_ref
from .rotary import apply_rotary_emb
from .sdpa import scaled_dot_product_attention

__version__ = "0.2.0"

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
    "apply_rotary_emb",
    "quantize_fp8",
    "scaled_dot_product_attention",
    "flex_attention",
    "create_block_mask",
    "unpad_input",
    "pad_input",
    "attention_ref",
    "attention_backend",
    "set_backend",
    "get_backend",
    "__version__",
]
