"""Hugging Face transformers backend: importing this module registers flashattn2 as an attention
implementation.

    import flashattn2.integrations.transformers as fa2
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=fa2.ATTN_IMPLEMENTATION)

transformers sends any implementation name containing "flash" to its hub-kernel loader, hence the name.
It also builds no mask for an implementation without a registered mask function (padding and causality
would be silently lost), so the same name gets transformers' FlashAttention mask function: a 2-D padding
mask or None. Padding goes through unpad / varlen, never through a materialised mask; packed sequences
come from cu_seq_lens_* keyword arguments or from position ids that restart at 0.
"""

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from ..bert_padding import pad_input, unpad_input
from ..checks import SUPPORTED_DTYPES, check_transformers_call
from ..interface import flash_attn_func, flash_attn_varlen_func

ATTN_IMPLEMENTATION = "fa2_triton"


def _target_dtype(query: torch.Tensor, module: torch.nn.Module) -> torch.dtype:
    """Half-precision inputs stay; fp32 ones (e.g. layer norms kept in fp32) go to the autocast dtype or the
    weights' half dtype, as transformers does for FlashAttention."""
    if query.dtype in SUPPORTED_DTYPES:
        return query.dtype
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type)
    for param in module.parameters():
        if param.dtype in SUPPORTED_DTYPES:
            return param.dtype
    raise TypeError(f"flashattn2 computes in float16 or bfloat16; the attention inputs are {query.dtype} and the "
                    "module has no half-precision weights to follow: load the model in bfloat16 or use autocast")


def _packed_from_position_ids(position_ids: torch.Tensor):
    """(cu_seqlens, max_seqlen) of sequences packed in one row, where the position ids restart at 0; None when
    the row is one sequence. Reads the position ids on the host (one sync), as transformers' FA2 path does."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    pos = position_ids[0]
    starts = torch.nonzero(pos == 0).flatten()
    if starts.numel() <= 1 and (starts.numel() == 0 or int(starts[0]) == 0):
        return None
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("packed sequences by position_ids must start with position 0")
    cu = torch.cat([starts, torch.tensor([pos.numel()], device=pos.device)]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query (batch, heads, L, dim), key/value (batch, heads_k, S,
    dim); returns ((batch, L, heads, dim), None)."""
    check_transformers_call(query, value, attention_mask, kwargs)
    batch, _, seqlen_q, _ = query.shape
    dtype = _target_dtype(query, module)
    q, k, v = (x.transpose(1, 2).to(dtype) for x in (query, key, value))
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # transformers' sliding window counts the query's own key: it sees sliding_window keys in all
    window = (sliding_window - 1, -1) if sliding_window is not None else (-1, -1)
    # s_aux: gpt-oss's per-head attention sinks, flashattn2's learnable_sink (gradients reach the parameter)
    kw = dict(dropout_p=dropout, softmax_scale=scaling, causal=causal, window_size=window,
              softcap=softcap if softcap else 0.0, learnable_sink=kwargs.get("s_aux"))
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if attention_mask is not None:
        k_u, idx_k, cu_k, max_k, _ = unpad_input(k, attention_mask)
        v_u = v.reshape(-1, *v.shape[2:])[idx_k]
        # query rows are the last L positions of the mask (left padding while generating)
        q_u, idx_q, cu_q, max_q, _ = unpad_input(q, attention_mask[:, -seqlen_q:])
        out = pad_input(flash_attn_varlen_func(q_u, k_u, v_u, cu_q, cu_k, max_q, max_k, **kw), idx_q, batch,
                        seqlen_q)
    elif cu_q is not None:
        if batch != 1:
            raise ValueError("cu_seq_lens_q/cu_seq_lens_k describe sequences packed in a batch of one row")
        max_q, max_k = int(kwargs["max_length_q"]), int(kwargs["max_length_k"])
        out = flash_attn_varlen_func(q[0], k[0], v[0], cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k,
                                     **kw)[None]
    else:
        packed = _packed_from_position_ids(kwargs.get("position_ids")) if seqlen_q == k.shape[1] else None
        if packed is not None:
            cu, longest = packed
            out = flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, longest, longest, **kw)[None]
        else:
            out = flash_attn_func(q, k, v, **kw)
    return out.to(query.dtype), None


AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, flash_attention_mask)
