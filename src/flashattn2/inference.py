"""The inference half of the API: flash_attn_with_kvcache (decoding over a dense or paged KV cache, with
append, rotary embedding and split-KV) and flash_attn_combine (FlashAttention-3's), the merge of
attention computed over disjoint parts of the keys: the building block of split-KV decoding and of
context parallelism."""

import contextlib
from typing import Optional

import torch

from . import checks, fp8, sinks
from .checks import (
    attn_options,
    check_combine,
    check_descales,
    check_kvcache,
    is_fp8,
    strict_kvcache,
    unit_last_stride,
)
from .kernels import backends
from .kernels.launch import PlanCache
from .kernels.params import AttnOptions
from .kernels.portable import combine as combine_kernels
from .kernels.portable.kvcache import kvcache_attention, v_is_k_view
from .ops import device_guard, is_traced
from .rotary import rotate


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
    dtype = check_combine(out_partial, lse_partial, out, out_dtype)
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



# ----------------------------------------------------------------------------------------------
# flash_attn_with_kvcache


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
):
    """
    If k and v are not None, k_cache and v_cache are updated in place with the new values from k and v:
    the rows go to positions cache_seqlens[i] ... cache_seqlens[i] + seqlen_new - 1 of sequence i (of
    cache row cache_batch_idx[i], or through block_table). Attention then runs over the updated cache.
    This serves incremental decoding: the new keys and values are appended and attended in one call.

    If rotary_cos and rotary_sin are given, the rotary embedding is applied to k before it is stored, at
    positions cache_seqlens[i] + j, and to q: at positions cache_seqlens[i] + r when causal or local,
    otherwise at position cache_seqlens[i] for every row. rotary_interleaved=True rotates pairs of even
    and odd dimensions (GPT-J style), False the first and second halves (GPT-NeoX style).

    Sequence i attends to cache positions [cache_leftpad[i], cache_seqlens[i] + seqlen_new). Causal and
    local masks are aligned to the bottom-right corner of that range, as in flash_attn_func.

    Supports multi-query and grouped-query attention (MQA/GQA) by passing in KV with fewer heads than Q.
    Note that the number of heads in Q must be divisible by the number of heads in KV.

    The index tensors' values (cache_seqlens, cache_leftpad, cache_batch_idx, block_table) are checked on
    the GPU without a sync: a sequence with a bad value reads and writes nothing, its output is NaN, and
    the next call on the device raises a ValueError naming the problem (FLASHATTN2_SYNC_CHECKS=1: this
    call). Everything else is checked on the host from shapes, so a decode step can be captured in a CUDA
    graph.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim)
        k_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim) without block_table,
            (num_blocks, page_block_size, nheads_k, headdim) with block_table; any page_block_size.
        v_cache: the same shape as k_cache.
        k: (batch_size, seqlen_new, nheads_k, headdim). Optional: new keys to append.
        v: (batch_size, seqlen_new, nheads_k, headdim). Optional: new values, given with k.
        rotary_cos: (seqlen_ro, rotary_dim / 2), rotary_dim a multiple of 16 and at most headdim, seqlen_ro at
            least the cache capacity. Only with k and v.
        rotary_sin: (seqlen_ro, rotary_dim / 2).
        cache_seqlens: int, or (batch_size,) int32: the cache lengths before the append. None: the whole
            capacity (then k and v cannot be appended).
        cache_batch_idx: (batch_size,) int32: the cache row (or block_table row) of each sequence. None: row i.
        cache_leftpad: (batch_size,) int32: the first valid cache position of each sequence. None: 0.
        block_table: (batch_size, max_num_blocks_per_seq) int32: the pages of each sequence.
        softmax_scale: float. The scaling of QK^T before applying softmax. Default to 1 / sqrt(headdim).
        causal: bool. Whether to apply causal attention mask (e.g., for auto-regressive modeling).
        window_size: (left, right). If not (-1, -1), implements sliding window local attention.
        softcap: float. Anything > 0 activates softcapping attention.
        rotary_interleaved: bool. Only applicable if rotary_cos and rotary_sin are passed in.
        alibi_slopes: (nheads,) or (batch_size, nheads), fp32. A bias of (-alibi_slope * |i + seqlen_k -
            seqlen_q - j|) is added to the attention score of query i and key j.
        num_splits: int. Splits of the keys, merged afterwards (split-KV). 0: a heuristic from the shapes
            only (no sync); 1: no split.
        return_softmax_lse: bool. Whether to return the logsumexp of the attention scores.
        q_descale, k_descale, v_descale: (batch_size, nheads_k), float32, with q, k_cache, v_cache (and k, v) in
            torch.float8_e4m3fn: the true values are the fp8 ones times these factors (k and v are appended as
            they are, so they must be quantised with the cache's scales). The output is then bfloat16; no rotary.
        learnable_sink: (nheads,), float32 or q's dtype: an attention sink per query head (see flash_attn_func);
            softmax_lse then includes it. Not with FP8.
    Return:
        out: (batch_size, seqlen, nheads, headdim).
        softmax_lse [optional, if return_softmax_lse=True]: (batch_size, nheads, seqlen). The logsumexp of each
            row of the matrix QK^T * scaling (e.g., log of the softmax normalization factor); +inf (and out 0)
            for a row that sees no key.
    """
    traced = is_traced(q)
    given = (q_descale, k_descale, v_descale)
    key = None if traced else _seen_key(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                        cache_batch_idx, cache_leftpad, block_table, alibi_slopes, softmax_scale,
                                        causal, window_size, softcap, rotary_interleaved, num_splits,
                                        (*given, learnable_sink))
    seen = None if key is None else _seen.get(key)
    key_q, key_k, key_v = q, k, v
    plan = None
    descales = None if q_descale is None and k_descale is None and v_descale is None else given
    if seen is None:
        fp8_call = descales is not None or is_fp8(q, k_cache, v_cache)
        check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                      cache_leftpad, block_table, num_splits, fp8_call)
        if fp8_call:
            descales = check_descales(q, *given, q.shape[0], k_cache.shape[2], False)
        opts = attn_options(q, None, None, 0, 0, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes,
                            False)
        q = unit_last_stride(q)
        if k is not None:
            k, v = unit_last_stride(k), unit_last_stride(v)
    else:
        opts, plan = seen
        opts = opts._replace(alibi_slopes=alibi_slopes)
    if learnable_sink is not None:  # before the call appends to the cache
        sinks.check_sink(learnable_sink, q, q.shape[-2], opts, descales is not None)
        if not traced:  # the kernels fold it in (the traced op takes none: fold() below)
            opts = opts._replace(learnable_sink=learnable_sink.detach().contiguous())
    if checks.STRICT:  # the values, at every call (a repeated call skips only the checks of shapes and types)
        strict_kvcache(k_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, q.shape[0],
                       0 if k is None else k.shape[1])
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    if traced:
        out, lse = _kvcache_op(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                               cache_leftpad, block_table, opts.alibi_slopes, opts.softmax_scale, opts.window_left,
                               opts.window_right, opts.softcap, bool(rotary_interleaved), num_splits,
                               *(descales or (None, None, None)))
    else:
        out, lse, plan = _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                                  cache_leftpad, block_table, opts, bool(rotary_interleaved), num_splits, plan,
                                  descales)
        # remembered when the inputs went in as they came (no layout fix-up the fast path would skip)
        unchanged = (q is key_q and k is key_k and v is key_v and opts.alibi_slopes is alibi_slopes
                     and (descales is None or all(a is b for a, b in zip(descales, given, strict=True))))
        if seen is None and key is not None and unchanged:
            _seen.add(key, (opts._replace(alibi_slopes=None, learnable_sink=None), plan))
    if learnable_sink is not None and traced:
        out, lse = sinks.fold(out, lse, learnable_sink, varlen=False)
    return (out, lse) if return_softmax_lse else out


# Eager calls that passed every check, by everything the checks and the launch plan read (shapes, strides,
# dtypes, devices, pointer alignment, options): a decode loop repeats one call, and a repeat skips the checks.
_seen = PlanCache()


def _layout(x):
    return None if x is None else (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15)


def _seen_key(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
              block_table, alibi_slopes, softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits,
              descales):
    """The key of a call in _seen, or None when an argument is not of a plain type (the checks judge it)."""
    key = []
    for x in (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table,
              alibi_slopes, *descales):
        if x is None:
            key.append(None)
        elif type(x) is torch.Tensor:
            key.append((x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15))
        else:
            return None
    if type(cache_seqlens) is torch.Tensor:
        key.append(_layout(cache_seqlens))
    elif cache_seqlens is None or type(cache_seqlens) is int:
        key.append(cache_seqlens)
    else:
        return None
    if type(window_size) is not tuple:
        return None
    # a value cache that is a view of the key cache's channels is read from the key tile (one latent cache)
    shared = v_is_k_view(k_cache, v_cache)
    return (*key, shared, softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits,
            backends.get_backend())


def _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
             block_table, opts: AttnOptions, rotary_interleaved: bool, num_splits: int, plan=None, descales=None):
    """Rotate, append, attend: (out, lse, plan). The op's body, called directly by eager calls: the op's
    dispatch costs more host time than a decode step's kernels."""
    with device_guard(q):
        if rotary_cos is not None:
            k = rotate(k, rotary_cos, rotary_sin, rotary_interleaved, False, cache_seqlens, None, None, False)
            if opts.window_left >= 0 or opts.window_right >= 0:
                q = rotate(q, rotary_cos, rotary_sin, rotary_interleaved, False, cache_seqlens, None, None, False)
            else:
                # without a mask every query row sits at the position of the first new key
                b, s, h, d = q.shape
                q = rotate(q.reshape(b, 1, s * h, d), rotary_cos, rotary_sin, rotary_interleaved, False, cache_seqlens,
                           None, None, False).reshape(b, s, h, d)
        # the Gluon maker only where a plan is to be made: a repeated call brings its plan
        hopper = backends.kvcache_hopper() if plan is None else None
        return kvcache_attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_leftpad, cache_batch_idx,
                                 block_table, opts, num_splits, plan, descales, hopper)


@torch.library.custom_op("flashattn2::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def _kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                v: Optional[torch.Tensor], rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
                cache_seqlens: Optional[torch.Tensor], cache_batch_idx: Optional[torch.Tensor],
                cache_leftpad: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                alibi_slopes: Optional[torch.Tensor], softmax_scale: float, window_left: int, window_right: int,
                softcap: float, rotary_interleaved: bool, num_splits: int, q_descale: Optional[torch.Tensor] = None,
                k_descale: Optional[torch.Tensor] = None,
                v_descale: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    opts = AttnOptions(softmax_scale, window_left, window_right, softcap, alibi_slopes=alibi_slopes)
    descales = None if q_descale is None else (q_descale, k_descale, v_descale)
    out, lse, _ = _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                           cache_leftpad, block_table, opts, rotary_interleaved, num_splits, None, descales)
    return out, lse


@_kvcache_op.register_fake
def _kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                  block_table, alibi_slopes, softmax_scale, window_left, window_right, softcap, rotary_interleaved,
                  num_splits, q_descale=None, k_descale=None, v_descale=None):
    batch, seqlen_q, nheads, _ = q.shape
    out_dtype = fp8.OUT_DTYPE if q.dtype == fp8.FP8_DTYPE else q.dtype
    # out takes the value cache's head dim (a latent cache's is narrower than the query's)
    return (q.new_empty((*q.shape[:-1], v_cache.shape[-1]), dtype=out_dtype),
            q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32))
