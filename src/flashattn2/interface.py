"""The flash_attn-compatible API: argument checks (checks.py) and layouts, then ops.attention (autograd,
tracing), with a cache of the dense calls that passed the checks.

Everything is checked on the host from shapes, dtypes and devices, with no device-to-host sync;
the values of cu_seqlens are checked on the GPU (kernels/portable/cu_seqlens.py).
"""

from typing import NamedTuple

import torch

from . import checks, fp8, sinks
from .checks import (
    MAX_HEAD_DIM,  # noqa: F401 (public here before checks.py)
    attn_options,
    check_dense,
    check_descales,
    check_packed,
    check_paged_varlen,
    check_varlen,
    is_fp8_call,
    strict_block_table,
    strict_cu_seqlens,
    unit_last_stride,
)
from .kernels import backends
from .kernels.backends import forward_plan
from .kernels.launch import PlanCache, align
from .kernels.params import AttnOptions
from .kernels.portable.kvcache import kvcache_attention
from .ops import ForwardOnly, attention, is_traced

# ----------------------------------------------------------------------------------------------
# public API (flash_attn 2.x names, argument order, defaults and return values)


def _run(q, k, v, opts: AttnOptions, return_attn_probs, plan=None):
    if opts.dropout_p > 0:
        # dropout's Philox seed comes from torch's generator, so torch.manual_seed makes runs repeatable
        opts = opts._replace(rng_seed=torch.randint(0, 2**62, (1,), dtype=torch.int64, device=q.device))
    out, lse, probs = attention(q, k, v, opts, bool(return_attn_probs and opts.dropout_p > 0), plan)
    if not return_attn_probs:
        return out
    return out, lse, probs


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
               causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, descales=None,
               learnable_sink=None):
    """Shared by every public function once the layout (dense or packed) has been checked."""
    opts = attn_options(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                        window_size, softcap, alibi_slopes, deterministic)
    if learnable_sink is not None:
        return _run_sink(q, k, v, opts, learnable_sink, return_attn_probs, descales is not None)
    if descales is not None:
        return _run_fp8(q, k, v, opts, descales, return_attn_probs)
    return _run(q, k, v, opts, return_attn_probs)


def _run_sink(q, k, v, opts: AttnOptions, sink: torch.Tensor, return_attn_probs: bool, is_fp8: bool):
    """A call with learnable_sink (sinks.py): lse includes the sink; gradients reach the sink too."""
    sinks.check_sink(sink, q, q.shape[-2], opts, is_fp8)
    out, lse = sinks.attention(q, k, v, sink, opts)
    return (out, lse, None) if return_attn_probs else out


def _run_fp8(q, k, v, opts: AttnOptions, descales: tuple, return_attn_probs: bool, plan=None):
    batch = q.shape[0] if opts.cu_seqlens_q is None else opts.cu_seqlens_q.shape[0] - 1
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    descales = check_descales(q, *descales, batch, k.shape[-2], grad)
    out, lse = fp8.attention(q, k, v, descales, opts, plan)
    return (out, lse, None) if return_attn_probs else out


# Dense calls that passed every check, by everything the checks read (shapes, strides, dtypes, devices,
# options) and the pointers' alignment, with their options and forward plan: a training loop repeats the
# same few calls, and a repeat skips the checks and the plan lookup. Only plain tensors with a unit last
# stride and calls without ALiBi (whose slopes tensor the key would have to describe) are remembered.
_seen = PlanCache()


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
    *,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
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

    If window_size != (-1, -1), implements sliding window local attention. Query at position i
    will only attend to keys between
    [i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]] inclusive.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim)
        k: (batch_size, seqlen, nheads_k, headdim)
        v: (batch_size, seqlen, nheads_k, headdim)
        dropout_p: float. Dropout probability.
        softmax_scale: float. The scaling of QK^T before applying softmax.
            Default to 1 / sqrt(headdim).
        causal: bool. Whether to apply causal attention mask (e.g., for auto-regressive modeling).
        window_size: (left, right). If not (-1, -1), implements sliding window local attention.
        softcap: float. Anything > 0 activates softcapping attention.
        alibi_slopes: (nheads,) or (batch_size, nheads), fp32. A bias of
            (-alibi_slope * |i + seqlen_k - seqlen_q - j|) is added to the attention score of query i and key j.
        deterministic: bool. Whether to use the deterministic implementation of the backward pass,
            which is slightly slower and uses more memory. The forward pass is always deterministic.
        return_attn_probs: bool. Whether to return the attention probabilities. This option is for
           testing only. The returned probabilities are not guaranteed to be correct
           (they might not have the right scaling).
        q_descale, k_descale, v_descale: (batch_size, nheads_k), float32, with q, k, v in torch.float8_e4m3fn
           (FlashAttention-3's FP8 forward): the true values are the fp8 ones times these factors. The output is
           then bfloat16; forward only, no dropout. flashattn2.quantize_fp8 makes such inputs.
        learnable_sink: (nheads,), float32 or the inputs' dtype (FlashAttention-4's attention sink): one extra
           logit per query head in each row's softmax, with no value; it gets a gradient. softmax_lse then
           includes it. Not with dropout or FP8.
    Return:
        out: (batch_size, seqlen, nheads, headdim).
        softmax_lse [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen). The
            logsumexp of each row of the matrix QK^T * scaling (e.g., log of the softmax
            normalization factor).
        S_dmask [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen, seqlen).
            The output of softmax (possibly with different scaling). It also encodes the dropout
            pattern (negative means that location was dropped, nonnegative means it was kept).
            None when dropout_p == 0.
    """
    key = None
    descales = (q_descale, k_descale, v_descale)
    if q_descale is None and k_descale is None and v_descale is None:
        descales_key = None
    elif type(q_descale) is torch.Tensor and type(k_descale) is torch.Tensor and type(v_descale) is torch.Tensor:
        # FP8's descales by layout (their values are the kernels' inputs); their checks run on every call
        descales_key = tuple((d.shape, d.stride(), d.dtype, d.device) for d in descales)
    else:
        descales_key = False  # not remembered: the checks judge them
    if (alibi_slopes is None and learnable_sink is None and descales_key is not False and type(q) is torch.Tensor
            and type(k) is torch.Tensor and type(v) is torch.Tensor and type(window_size) is tuple
            and not torch.compiler.is_compiling()):
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.device,
               k.device, v.device, align(q), align(k), align(v), dropout_p, softmax_scale, causal, window_size,
               softcap, deterministic, return_attn_probs, descales_key)
        seen = _seen.get(key)
        if seen is not None:
            opts, return_probs, plan = seen
            if descales_key is None:
                return _run(q, k, v, opts, return_probs, plan)
            return _run_fp8(q, k, v, opts, descales, return_probs, plan)
    is_fp8 = is_fp8_call(q, k, v, q_descale, k_descale, v_descale)
    check_dense(q, k, v, is_fp8)
    # a copy made here for a non-unit last stride would not match the key's tensors
    remember = key is not None and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    opts = attn_options(q, None, None, q.shape[1], k.shape[1], dropout_p, softmax_scale, causal, window_size,
                        softcap, alibi_slopes, deterministic)
    if learnable_sink is not None:
        return _run_sink(q, k, v, opts, learnable_sink, return_attn_probs, is_fp8)
    if is_fp8:
        result = _run_fp8(q, k, v, opts, descales, return_attn_probs)
        if remember:  # remembered once it ran: a call the FP8 path refuses is refused afresh each time
            _seen.add(key, (opts, return_attn_probs, forward_plan(q, k, v, opts, False)))
        return result
    plan = None
    if remember:
        # the plan does not depend on the dropout seed tensor, drawn per call in _run
        plan = forward_plan(q, k, v, opts, bool(return_attn_probs and opts.dropout_p > 0))
        _seen.add(key, (opts, return_attn_probs, plan))
    return _run(q, k, v, opts, return_attn_probs, plan)


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
    check_packed("qkv", qkv, 5, 3, "(batch, seqlen, 3, nheads, headdim)")
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
    check_packed("kv", kv, 5, 2, "(batch, seqlen, 2, nheads_k, headdim)")
    k, v = kv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
    *,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
):
    """dropout_p should be set to 0.0 during evaluation
    Supports multi-query and grouped-query attention (MQA/GQA) by passing in K, V with fewer heads
    than Q. Note that the number of heads in Q must be divisible by the number of heads in KV.

    If causal=True, the causal mask is aligned to the bottom right corner of the attention matrix
    of each sequence (see flash_attn_func). If the row of the mask is all zero, the output will be zero.

    Arguments:
        q: (total_q, nheads, headdim), where total_q = total number of query tokens in the batch.
        k: (total_k, nheads_k, headdim), where total_k = total number of key tokens in the batch.
        v: (total_k, nheads_k, headdim), where total_k = total number of key tokens in the batch.
        cu_seqlens_q: (batch_size + 1,), dtype torch.int32. The cumulative sequence lengths
           of the sequences in the batch, used to index into q.
        cu_seqlens_k: (batch_size + 1,), dtype torch.int32. The cumulative sequence lengths
           of the sequences in the batch, used to index into kv.
        max_seqlen_q: int. Maximum query sequence length in the batch.
        max_seqlen_k: int. Maximum key sequence length in the batch.
        block_table: (batch_size, max_num_blocks_per_seq), dtype torch.int32: a paged KV cache (its forward
           runs whether or not the inputs require grad; a backward through it raises). k and v are then the page
           pools (num_blocks, page_block_size, nheads_k, headdim), any
           page_block_size, and sequence i's keys are the first cu_seqlens_k[i + 1] - cu_seqlens_k[i]
           positions of its pages.
        q_descale, k_descale, v_descale: (batch_size, nheads_k), float32, for float8_e4m3fn q, k, v (see
           flash_attn_func).
        learnable_sink: (nheads,): an attention sink per query head (see flash_attn_func).
        Other arguments are those of flash_attn_func.
    Return:
        out: (total, nheads, headdim).
        softmax_lse [optional, if return_attn_probs=True]: (nheads, total_q_seqlen). The
            logsumexp of each row of the matrix QK^T * scaling (e.g., log of the softmax
            normalization factor).
        S_dmask [optional, if return_attn_probs=True]: (batch_size, nheads, max_seqlen_q, max_seqlen_k),
            flash_attn's encoding (see flash_attn_func); None when dropout_p == 0.
    """
    is_fp8 = is_fp8_call(q, k, v, q_descale, k_descale, v_descale)
    if block_table is not None:
        check_paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, block_table,
                           is_fp8)
        if checks.STRICT:
            lengths = strict_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q.shape[0], None)
            strict_block_table(block_table, lengths, k.shape[1], k.shape[0])
        return _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                             window_size, softcap, alibi_slopes, return_attn_probs, block_table, learnable_sink,
                             is_fp8)
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_fp8)
    if checks.STRICT:
        strict_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q.shape[0], k.shape[0])
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                      (q_descale, k_descale, v_descale) if is_fp8 else None, learnable_sink)


def _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                  window_size, softcap, alibi_slopes, return_attn_probs, block_table, learnable_sink=None,
                  is_fp8=False):
    """flash_attn_varlen_func over a paged KV cache (checked): the KV-cache kernels with the lengths of
    cu_seqlens_k. Inputs that require grad get an output whose backward raises: the paged kernels have none."""
    opts = attn_options(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0, softmax_scale, causal,
                        window_size, softcap, alibi_slopes, False)
    seqlens_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    traced = is_traced(q)
    if learnable_sink is not None:
        sinks.check_sink(learnable_sink, q, q.shape[-2], opts, is_fp8)
        if not traced:  # the KV-cache kernels fold it in
            opts = opts._replace(learnable_sink=learnable_sink.detach().contiguous())
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        out, lse = ForwardOnly.apply(_paged_forward, _PAGED_NO_BACKWARD, q, k, v, seqlens_k, block_table, opts)
    else:
        out, lse = _paged_forward(q, k, v, seqlens_k, block_table, opts)
    if learnable_sink is not None and traced:
        out, lse = sinks.fold(out, lse, learnable_sink, varlen=True)
    return (out, lse, None) if return_attn_probs else out


def _paged_forward(q, k, v, seqlens_k, block_table, opts):
    out, lse, _ = kvcache_attention(unit_last_stride(q), k, v, None, None, seqlens_k, None, None, block_table, opts, 0)
    return out, lse


# why a backward through the paged varlen forward raises
_PAGED_NO_BACKWARD = ("flash_attn_varlen_func with block_table (a paged KV cache) has no backward: "
                      "the paged kernels are forward only; pass k and v as packed (total_k, nheads_k, "
                      "headdim) tensors to train")


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
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
    calling flash_attn_varlen_func on Q, K, V since the backward pass avoids explicit concatenation
    of the gradients of Q, K, V.

    Arguments:
        qkv: (total, 3, nheads, headdim), where total = total number of tokens in the batch.
        cu_seqlens: (batch_size + 1,), dtype torch.int32. The cumulative sequence lengths
           of the sequences in the batch, used to index into qkv.
        max_seqlen: int. Maximum sequence length in the batch.
        Other arguments and the return values are those of flash_attn_varlen_func.
    """
    check_packed("qkv", qkv, 4, 3, "(total, 3, nheads, headdim)")
    q, k, v = qkv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
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
    calling flash_attn_varlen_func on Q, K, V since the backward pass avoids explicit concatenation
    of the gradients of K, V.

    Arguments:
        q: (total_q, nheads, headdim), where total_q = total number of query tokens in the batch.
        kv: (total_k, 2, nheads_k, headdim), where total_k = total number of key tokens in the batch.
        Other arguments and the return values are those of flash_attn_varlen_func.
    """
    check_packed("kv", kv, 4, 2, "(total, 2, nheads_k, headdim)")
    k, v = kv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def set_backend(name: str) -> None:
    """Pick the kernels for the calls that follow: "auto" (the default), "gluon" or "triton", the values
    of the FLASHATTN2_BACKEND environment variable (kernels/backends.py says what each means)."""
    backends.set_backend(name)
    _seen.clear()


def get_backend() -> str:
    """The choice set_backend (or FLASHATTN2_BACKEND) made: "auto", "gluon" or "triton"."""
    return backends.get_backend()


class BackendChoice(NamedTuple):
    """What attention_backend() says: the kernels of each half, and why a half is not on Gluon."""

    forward: str  # "gluon-sm90" or "triton"
    backward: str  # "gluon-sm90" (dK/dV; dQ from the Triton dQ kernel) or "triton"
    reason: str | None  # why not Gluon, forward then backward; None when both are


def attention_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    return_attn_probs: bool = False,
) -> BackendChoice:
    """Which kernels flash_attn_func(q, k, v, ...) with these arguments runs on, forward and backward
    (the backward's gradient assumed laid out like q). Packed (varlen) calls follow the same rules."""
    opts = attn_options(q, None, None, q.shape[1], k.shape[1], dropout_p, softmax_scale, causal, window_size,
                        softcap, alibi_slopes, False)
    fwd, fwd_why = backends.forward_backend(q, k, v, opts, bool(return_attn_probs and opts.dropout_p > 0))
    bwd, bwd_why = backends.backward_backend(q, q, k, v, opts)
    reasons = [f"{half}: {why}" for half, why in (("forward", fwd_why), ("backward", bwd_why)) if why]
    return BackendChoice(fwd, bwd, "; ".join(reasons) or None)
