"""flashattn2: FlashAttention-2 as Triton kernels, with the flash_attn 2.x API.

    from flashattn2 import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)  # q, k, v: (batch, seqlen, nheads, headdim)
"""

from .interface import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from .reference import attention_ref

__version__ = "0.1.0"

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "attention_ref",
           "__version__"]
