"""Every host-side check of the public functions' arguments, and attn_options: the one builder of a call's
AttnOptions.

Everything here is judged on the host from shapes, strides, dtypes, devices and Python values, with no
device-to-host sync (but for the opt-in FLASHATTN2_STRICT=1 checks at the end); the values of index tensors
(cu_seqlens, the KV-cache tables) are checked on the GPU
(kernels/portable/cu_seqlens.py, kernels/portable/kvcache.py). The API modules (interface, inference, fp8, rotary, sdpa,
distributed, integrations) import from here; this module imports none of them, so the graph stays acyclic.
"""

import math
import os
from collections.abc import Mapping, Sequence

import torch

from .kernels.common import INTERPRET
from .kernels.params import AttnOptions

MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPE = torch.float8_e4m3fn
_OTHER_FP8 = (torch.float8_e5m2, torch.float8_e5m2fnuz, torch.float8_e4m3fnuz)
COMBINE_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
COMBINE_MAX_HEAD_DIM = 512
# flash_attn_with_kvcache over a latent cache (MLA decoding: query/key 576, value 512)
LATENT_MAX_HEAD_DIM = 576
LAYOUTS = ("zigzag", "contiguous")  # the shard layouts of distributed.py
# FLASHATTN2_STRICT=1: the values of the index tensors (cu_seqlens, cache_seqlens, cache_batch_idx, cache_leftpad,
# block_table) are also read on the host and checked at the call, raising there (a device-to-host copy per call:
# for debugging, never inside a CUDA-graph capture); by default they are checked on the GPU, without a sync
STRICT = os.environ.get("FLASHATTN2_STRICT", "0") not in ("", "0")


# ----------------------------------------------------------------------------------------------
# q, k, v and the options every attention call shares


def unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dimension is contiguous, else a contiguous copy: the kernels need only that."""
    return x if x.stride(-1) == 1 else x.contiguous()


def is_fp8(*tensors) -> bool:
    """Whether any of the arguments is a tensor in one of torch's float8 dtypes."""
    return any(isinstance(x, torch.Tensor) and x.dtype in (FP8_DTYPE, *_OTHER_FP8) for x in tensors)


def is_fp8_call(q, k, v, q_descale, k_descale, v_descale) -> bool:
    """Whether a call takes the FP8 path: any descale given, or any of q, k, v in a float8 dtype."""
    return q_descale is not None or k_descale is not None or v_descale is not None or is_fp8(q, k, v)


def check_fp8_dtypes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k and v all float8_e4m3fn (TypeError naming e5m2 and the fnuz formats apart)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != FP8_DTYPE:
            if x.dtype in _OTHER_FP8:
                raise TypeError(f"{name} is {x.dtype}: FP8 attention takes torch.float8_e4m3fn (FlashAttention-3's "
                                "format); e5m2 has too few mantissa bits for q, k and v")
            raise TypeError(f"FP8 attention needs q, k and v all in torch.float8_e4m3fn, got {q.dtype}, {k.dtype}, "
                            f"{v.dtype}")


def check_descales(q: torch.Tensor, q_descale, k_descale, v_descale, batch: int, nheads_k: int,
                   requires_grad: bool) -> tuple:
    """An FP8 call's q in float8_e4m3fn, all three descales given as (batch, nheads_k) float32 tensors on q's
    device, and no gradient wanted; returns the descales contiguous."""
    if q.dtype != FP8_DTYPE:
        raise TypeError(f"q_descale, k_descale and v_descale apply to float8_e4m3fn inputs, got {q.dtype}")
    missing = [name for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
               if x is None]
    if missing:
        raise ValueError(f"float8_e4m3fn inputs need q_descale, k_descale and v_descale ((batch, nheads_k) "
                         f"float32); missing: {', '.join(missing)} (flashattn2.quantize_fp8 makes them)")
    if requires_grad:
        raise NotImplementedError("FP8 attention is forward only: call it under torch.no_grad() or with tensors "
                                  "that do not require grad")
    out = []
    for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.float32 or tuple(x.shape) != (batch, nheads_k):
            raise ValueError(f"{name} must be float32 of shape (batch, nheads_k) = ({batch}, {nheads_k}), got "
                             f"{x.dtype} {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on {q.device}, got {x.device}")
        out.append(x.contiguous())  # the kernel indexes them as (batch, nheads_k) rows
    return tuple(out)


def check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ndim: int, layout: str,
                  is_fp8: bool = False) -> None:
    """q, k, v are tensors of ndim dimensions, of one supported dtype (float8_e4m3fn when is_fp8), on one
    device that can run them (CUDA, or the CPU under TRITON_INTERPRET=1)."""
    # written out rather than looped: this runs on every call
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != ndim:
            raise ValueError(f"{name} must have {ndim} dimensions {layout}, got shape {tuple(x.shape)}")
    dtype = q.dtype
    if is_fp8:
        check_fp8_dtypes(q, k, v)
    elif dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"flashattn2 supports float16 and bfloat16 inputs (and float8_e4m3fn with descales), got "
                        f"q.dtype={dtype}")
    if k.dtype != dtype or v.dtype != dtype:
        raise TypeError(f"q, k and v must share one dtype, got {dtype}, {k.dtype}, {v.dtype}")
    device = q.device
    if k.device != device or v.device != device:
        raise ValueError(f"q, k and v must be on one device, got {device}, {k.device}, {v.device}")
    if device.type != "cuda":
        if device.type != "cpu":
            raise ValueError(f"flashattn2 runs on CUDA devices (or the CPU interpreter), got {device}")
        if not INTERPRET:
            raise ValueError("CPU tensors run only through the Triton interpreter: set TRITON_INTERPRET=1 "
                             "before importing flashattn2, or move the tensors to a CUDA device")


def check_gqa(nheads: int, nheads_k: int) -> None:
    """The query heads divide evenly among the key/value heads (MQA/GQA)."""
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"the number of query heads ({nheads}) must be divisible by the number of "
                         f"key/value heads ({nheads_k})")


def check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, unlike_v: bool = False) -> None:
    """Head counts and head dims, from the last two dimensions of dense or packed tensors. unlike_v: v's head dim
    may differ from q's and k's (MLA; the training entry points), up to MAX_HEAD_DIM."""
    nheads, head_dim = q.shape[-2], q.shape[-1]
    nheads_k = k.shape[-2]
    if v.shape[-2] != nheads_k:
        raise ValueError(f"k and v must have the same number of heads, got {nheads_k} and {v.shape[-2]}")
    if k.shape[-1] != head_dim or (v.shape[-1] != head_dim and not unlike_v):
        raise ValueError(f"head dims differ: q {head_dim}, k {k.shape[-1]}, v {v.shape[-1]}")
    if unlike_v and not 1 <= v.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"v's head dim must be between 1 and {MAX_HEAD_DIM}, got {v.shape[-1]}")
    if head_dim > MAX_HEAD_DIM or head_dim < 1:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")
    check_gqa(nheads, nheads_k)


def check_softmax_scale(softmax_scale: float | None, head_dim: int) -> float:
    """The softmax scale: 1 / sqrt(head_dim) for None, else the given value, which must be positive and finite."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    softmax_scale = float(softmax_scale)
    if not (math.isfinite(softmax_scale) and softmax_scale > 0.0):
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale}")
    return softmax_scale


def check_options(q: torch.Tensor, batch: int, nheads: int, dropout_p: float, causal: bool,
                  window_size: Sequence[int], softcap: float, alibi_slopes: torch.Tensor | None,
                  ) -> tuple[int, int, float, float, torch.Tensor | None]:
    """dropout_p in [0, 1), window_size a pair, softcap finite >= 0, alibi_slopes float32 (nheads,) or
    (batch, nheads) on q's device; returns (window_left, window_right, softcap, dropout_p, alibi_slopes)."""
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if window_size == (-1, -1):  # the default, and nearly every call
        left = right = -1
    else:
        if isinstance(window_size, (str, bytes)) or len(window_size) != 2:
            raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
        # -1 (any negative) is unbounded; causal is the window's right edge at the diagonal
        left, right = max(int(window_size[0]), -1), max(int(window_size[1]), -1)
    if causal:
        right = 0
    softcap = float(softcap)
    if not (math.isfinite(softcap) and softcap >= 0.0):
        raise ValueError(f"softcap must be a finite number >= 0, got {softcap}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"alibi_slopes must be a torch.Tensor, got {type(alibi_slopes).__name__}")
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
        if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
            raise ValueError(f"alibi_slopes must have shape (nheads,) = ({nheads},) or (batch, nheads) = "
                             f"({batch}, {nheads}), got {tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != q.device:
            raise ValueError(f"alibi_slopes must be on {q.device}, got {alibi_slopes.device}")
        alibi_slopes = unit_last_stride(alibi_slopes)
    return left, right, softcap, dropout_p, alibi_slopes


def check_cu_seqlens(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, q: torch.Tensor) -> None:
    """cu_seqlens_q and cu_seqlens_k are int32 (batch + 1,) tensors of one length on q's device, and the
    max_seqlens ints >= 0; their values are checked on the device (kernels/portable/cu_seqlens.py)."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ValueError(f"{name} must have shape (batch + 1,), got {tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{name} must be on {q.device}, got {cu.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length, got "
                         f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"{name} must be an int >= 0, got {m!r}")


def attn_options(q: torch.Tensor, cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
                 max_seqlen_q: int, max_seqlen_k: int, dropout_p: float, softmax_scale: float | None, causal: bool,
                 window_size: Sequence[int], softcap: float, alibi_slopes: torch.Tensor | None,
                 deterministic: bool) -> AttnOptions:
    """The checked options of a call (check_options, check_softmax_scale), for dense q (batch, seqlen, nheads,
    headdim) or packed q (total, nheads, headdim) with cu_seqlens; the dropout seed is drawn per call later."""
    batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    left, right, softcap, dropout_p, alibi_slopes = check_options(
        q, batch, q.shape[-2], dropout_p, bool(causal), window_size, softcap, alibi_slopes)
    return AttnOptions(softmax_scale=check_softmax_scale(softmax_scale, q.shape[-1]), window_left=left,
                       window_right=right, softcap=softcap, dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                       cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                       max_seqlen_k=max_seqlen_k, deterministic=bool(deterministic))


# ----------------------------------------------------------------------------------------------
# the layouts of interface.py's functions


def check_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_fp8: bool = False) -> None:
    """flash_attn_func's q, k, v: (batch, seqlen, nheads, headdim) tensors of one batch, k and v of one seqlen."""
    check_tensors(q, k, v, 4, "(batch, seqlen, nheads, headdim)", is_fp8)
    batch, seqlen_k = q.shape[0], k.shape[1]
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"batch sizes differ: q {batch}, k {k.shape[0]}, v {v.shape[0]}")
    if v.shape[1] != seqlen_k:
        raise ValueError(f"k and v must have the same seqlen, got {seqlen_k} and {v.shape[1]}")
    check_heads(q, k, v, unlike_v=not is_fp8)


def check_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, is_fp8: bool = False) -> None:
    """flash_attn_varlen_func's packed q, k, v: (total, nheads, headdim), k and v of one length, and their
    cu_seqlens and max_seqlens."""
    check_tensors(q, k, v, 3, "(total, nheads, headdim)", is_fp8)
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"k and v must have the same number of rows, got {k.shape[0]} and {v.shape[0]}")
    check_heads(q, k, v, unlike_v=not is_fp8)
    check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q)


def check_packed(name: str, x: torch.Tensor, ndim: int, count: int, layout: str) -> None:
    """A packed qkv or kv tensor: ndim dimensions, `count` (3 or 2) along the third-last one."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim or x.shape[-3] != count:
        raise ValueError(f"{name} must have shape {layout}, got {tuple(x.shape)}")


def check_paged_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                       cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float,
                       block_table: torch.Tensor, is_fp8: bool = False) -> None:
    """flash_attn_varlen_func with block_table: without FP8 or dropout (a backward through it raises, in
    interface.py), packed q (total_q, nheads, headdim), k and v page pools (num_blocks, page_block_size, nheads_k,
    headdim) of one shape with a contiguous last dimension, and block_table an int32 (batch,
    max_num_blocks_per_seq) on q's device."""
    if is_fp8:
        raise NotImplementedError("FP8 with block_table: use flash_attn_with_kvcache for an FP8 paged cache")
    if dropout_p != 0.0:
        raise NotImplementedError("dropout with block_table: the paged KV cache is for inference (dropout_p=0)")
    for name, x, ndim in (("q", q, 3), ("k", k, 4), ("v", v, 4)):
        if not isinstance(x, torch.Tensor) or x.dim() != ndim:
            layout = "(total_q, nheads, headdim)" if ndim == 3 else "(num_blocks, page_block_size, nheads_k, headdim)"
            raise ValueError(f"with block_table, {name} must be {layout}")
    check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q)
    check_tensors(q.unsqueeze(0), k, v, 4, "")  # the shared checks read (batch, seqlen, heads, dim)
    check_heads(q, k, v)
    if k.shape != v.shape:
        raise ValueError(f"k and v page pools must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise ValueError("block_table must be a (batch_size, max_num_blocks_per_seq) int32 tensor")
    batch = cu_seqlens_q.shape[0] - 1
    if block_table.shape[0] != batch or block_table.device != q.device or block_table.stride(-1) != 1:
        raise ValueError(f"block_table must be ({batch}, max_num_blocks_per_seq), contiguous, on {q.device}")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("k and v page pools must have a contiguous last dimension")


# ----------------------------------------------------------------------------------------------
# inference.py: flash_attn_combine and flash_attn_with_kvcache


def check_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out: torch.Tensor | None,
                  out_dtype: torch.dtype | None) -> torch.dtype:
    """flash_attn_combine's arguments: float32 out_partial (num_splits, batch, seqlen, nheads, headdim) and
    lse_partial (num_splits, batch, seqlen, nheads) on one device, and out / out_dtype; returns the output dtype."""
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
    if out_partial.shape[-1] > COMBINE_MAX_HEAD_DIM:
        raise ValueError(f"head dim {out_partial.shape[-1]} above {COMBINE_MAX_HEAD_DIM}")
    dtype = out_dtype if out_dtype is not None else (out.dtype if out is not None else out_partial.dtype)
    if dtype not in COMBINE_OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {COMBINE_OUT_DTYPES}, got {dtype}")
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


def check_index(name: str, x: torch.Tensor | None, batch: int, device: torch.device) -> None:
    """An optional per-sequence index tensor (cache_seqlens, cache_batch_idx, cache_leftpad): (batch,) int32
    on `device`; its values are checked on the GPU."""
    if x is None:
        return
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.int32 or tuple(x.shape) != (batch,):
        raise ValueError(f"{name} must be a ({batch},) int32 tensor, got {tuple(x.shape)} {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name} must be on {device}, got {x.device}")


def check_latent_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k, rotary_cos,
                       is_fp8: bool) -> bool:
    """True for a KV-cache call whose value head dim is smaller than the query/key one (MLA decoding over a latent
    cache: 576/512, the value cache possibly a view of the key cache's first channels): query/key head dims up to
    LATENT_MAX_HEAD_DIM in multiples of 64 past 256, value head dims up to COMBINE_MAX_HEAD_DIM; no appended keys,
    rotary or FP8 there yet."""
    head_dim, head_dim_v = q.shape[-1], v_cache.shape[-1]
    if head_dim_v == head_dim and head_dim <= MAX_HEAD_DIM:
        return False
    if k_cache.shape[-1] != head_dim or k_cache.shape[-2] != v_cache.shape[-2]:
        raise ValueError(f"head dims differ: q {head_dim}, k_cache {k_cache.shape[-1]} (heads: k_cache "
                         f"{k_cache.shape[-2]}, v_cache {v_cache.shape[-2]})")
    if not 1 <= head_dim_v <= min(head_dim, COMBINE_MAX_HEAD_DIM):
        raise ValueError(f"v_cache's head dim must be between 1 and the query's ({head_dim}) and at most "
                         f"{COMBINE_MAX_HEAD_DIM}, got {head_dim_v}")
    if head_dim > LATENT_MAX_HEAD_DIM or (head_dim > MAX_HEAD_DIM and head_dim % 64):
        raise ValueError(f"head dim must be at most {MAX_HEAD_DIM}, or a multiple of 64 up to {LATENT_MAX_HEAD_DIM} "
                         f"for a latent cache, got {head_dim}")
    if k is not None or rotary_cos is not None or is_fp8:
        raise NotImplementedError("a value head dim unlike the query's in flash_attn_with_kvcache takes no appended "
                                  "k / v, rotary or FP8 yet")
    check_gqa(q.shape[-2], k_cache.shape[-2])
    return True


def check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                  block_table, num_splits, is_fp8: bool = False) -> None:
    """flash_attn_with_kvcache's shapes, dtypes and devices (the cache, the new k and v, the rotary tables,
    the index tensors, block_table, num_splits; no rotary with FP8); the index tensors' values are checked
    on the GPU."""
    check_tensors(q, k_cache, v_cache, 4, "(batch, seqlen, nheads, headdim)", is_fp8)
    latent = check_latent_cache(q, k_cache, v_cache, k, rotary_cos, is_fp8)
    if not latent:
        check_heads(q, k_cache, v_cache)
    batch, seqlen_q, _, head_dim = q.shape
    if latent:
        if k_cache.shape[:-1] != v_cache.shape[:-1]:
            raise ValueError(f"k_cache and v_cache must have the same shape but for the head dim, got "
                             f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    elif k_cache.shape != v_cache.shape:
        what = "page_block_size" if block_table is not None and k_cache.shape[1] != v_cache.shape[1] else "shape"
        raise ValueError(f"k_cache and v_cache must have the same {what}, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must have a contiguous last dimension (they are written in place)")
    if block_table is not None:
        if not isinstance(block_table, torch.Tensor):
            raise TypeError(f"block_table must be a torch.Tensor, got {type(block_table).__name__}")
        if block_table.dtype != torch.int32 or block_table.dim() != 2:
            raise ValueError(f"block_table must be a (batch, max_num_blocks_per_seq) int32 tensor, got "
                             f"{tuple(block_table.shape)} {block_table.dtype}")
        if block_table.device != q.device:
            raise ValueError(f"block_table must be on {q.device}, got {block_table.device}")
        if block_table.stride(-1) != 1:
            raise ValueError("block_table must have a contiguous last dimension")
        rows = block_table.shape[0]
        if (rows < batch and cache_batch_idx is None) or block_table.shape[1] == 0:
            raise ValueError(f"block_table has {rows} rows and {block_table.shape[1]} columns for a batch of {batch}")
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if cache_batch_idx is None and k_cache.shape[0] < batch:
            raise ValueError(f"k_cache has {k_cache.shape[0]} batch rows for a batch of {batch} (pass "
                             "cache_batch_idx to pick rows)")
        capacity = k_cache.shape[1]
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (the new keys and values to append)")
    if k is not None:
        for name, x in (("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
            expected = (batch, k.shape[1], k_cache.shape[2], head_dim)
            if tuple(x.shape) != expected:
                raise ValueError(f"{name} must be (batch, seqlen_new, nheads_k, headdim) = {expected}, got "
                                 f"{tuple(x.shape)}")
            if x.dtype != q.dtype or x.device != q.device:
                raise ValueError(f"{name} must be {q.dtype} on {q.device}, got {x.dtype} on {x.device}")
        if cache_seqlens is None:
            raise ValueError("appending k and v needs cache_seqlens: where each sequence's new rows go")
        if k.shape[1] > capacity:
            raise ValueError(f"seqlen_new {k.shape[1]} is larger than the cache capacity {capacity}")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos/rotary_sin need k and v: the rotary embedding is applied to the new keys "
                             "and to q")
        if rotary_cos.dim() != 2 or rotary_cos.shape != rotary_sin.shape:
            raise ValueError(f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2), got "
                             f"{tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
        rotary_dim = 2 * rotary_cos.shape[1]
        if rotary_dim % 16 != 0 or rotary_dim == 0 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim (2 * rotary_cos.shape[1] = {rotary_dim}) must be a positive multiple of "
                             f"16 and at most headdim {head_dim}")
        if rotary_cos.shape[0] < capacity:
            raise ValueError(f"rotary_cos/rotary_sin have {rotary_cos.shape[0]} positions, fewer than the cache "
                             f"capacity {capacity}")
        if rotary_cos.device != q.device or rotary_sin.device != q.device:
            raise ValueError(f"rotary_cos and rotary_sin must be on {q.device}")
        if rotary_cos.dtype != rotary_sin.dtype or not rotary_cos.dtype.is_floating_point:
            raise TypeError(f"rotary_cos and rotary_sin must share a floating dtype, got {rotary_cos.dtype} and "
                            f"{rotary_sin.dtype}")
    if isinstance(cache_seqlens, torch.Tensor):
        check_index("cache_seqlens", cache_seqlens, batch, q.device)
    elif cache_seqlens is not None and not isinstance(cache_seqlens, int):
        raise TypeError(f"cache_seqlens must be an int or a ({batch},) int32 tensor, got "
                        f"{type(cache_seqlens).__name__}")
    elif isinstance(cache_seqlens, int) and not 0 <= cache_seqlens <= capacity - (0 if k is None else k.shape[1]):
        raise ValueError(f"cache_seqlens {cache_seqlens} + seqlen_new is past the cache capacity {capacity}")
    check_index("cache_batch_idx", cache_batch_idx, batch, q.device)
    check_index("cache_leftpad", cache_leftpad, batch, q.device)
    if not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: a heuristic), got {num_splits!r}")
    if is_fp8 and rotary_cos is not None:
        raise NotImplementedError("rotary_cos/rotary_sin with FP8 inputs: rotate q and k before they are "
                                  "quantised (flashattn2.rotary.apply_rotary_emb)")


# ----------------------------------------------------------------------------------------------
# rotary.py, sdpa.py, integrations/transformers.py


def check_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seqlen_offsets: int | torch.Tensor,
                 cu_seqlens: torch.Tensor | None, max_seqlen: int | None) -> None:
    """apply_rotary_emb's arguments: x dense or packed with a contiguous last dimension, cos and sin
    (seqlen_rotary, rotary_dim / 2) of one floating dtype with rotary_dim <= headdim, seqlen_offsets an int
    or (batch,) int tensor, everything on one device that can run it."""
    if cu_seqlens is None:
        if x.dim() != 4:
            raise ValueError(f"x must be (batch, seqlen, nheads, headdim), got shape {tuple(x.shape)}")
    else:
        if x.dim() != 3:
            raise ValueError(f"with cu_seqlens, x must be (total_seqlen, nheads, headdim), got {tuple(x.shape)}")
        if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
            raise ValueError("cu_seqlens must be a 1-D int32 tensor")
        if max_seqlen is None:
            raise ValueError("max_seqlen is required with cu_seqlens")
    if cos.shape != sin.shape or cos.dim() != 2:
        raise ValueError(f"cos and sin must both be (seqlen_rotary, rotary_dim / 2), got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")
    rotary_dim = 2 * cos.shape[1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"rotary_dim {rotary_dim} (2 * cos.shape[1]) exceeds headdim {x.shape[-1]}")
    if cos.dtype != sin.dtype:
        raise TypeError(f"cos and sin dtypes differ: {cos.dtype}, {sin.dtype}")
    if not x.dtype.is_floating_point or not cos.dtype.is_floating_point:
        raise TypeError(f"x, cos and sin must be floating point, got {x.dtype} and {cos.dtype}")
    devices = {x.device, cos.device, sin.device}
    if isinstance(seqlen_offsets, torch.Tensor):
        devices.add(seqlen_offsets.device)
        batch = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
        if seqlen_offsets.shape != (batch,) or seqlen_offsets.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"seqlen_offsets must be an int or a ({batch},) int32/int64 tensor")
    if cu_seqlens is not None:
        devices.add(cu_seqlens.device)
    if len(devices) != 1:
        raise ValueError(f"tensors on different devices: {sorted(map(str, devices))}")
    if x.stride(-1) != 1:
        raise ValueError("x must have a contiguous last dimension")
    if x.device.type != "cuda" and not INTERPRET:
        raise ValueError("apply_rotary_emb needs CUDA tensors (CPU tensors only under TRITON_INTERPRET=1)")


def check_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
               enable_gqa: bool) -> None:
    """scaled_dot_product_attention's arguments: no attn_mask, (batch, heads, seqlen, headdim) tensors, fewer
    key/value heads only with enable_gqa; flash_attn_func checks the rest."""
    if attn_mask is not None:
        raise NotImplementedError(
            "flashattn2.scaled_dot_product_attention does not take attn_mask: use is_causal=True for causal "
            "masks, flash_attn_func(window_size=...) for sliding windows, or flash_attn_varlen_func for padding "
            "and packed sequences")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be (batch, heads, seqlen, headdim), got shape {tuple(x.shape)}")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads and key/value {key.shape[1]}: pass enable_gqa=True for "
                         "grouped-query attention")


def check_transformers_call(query: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                            kwargs: Mapping) -> None:
    """The Hugging Face attention function's call: no attention weights asked for, a 2-D padding mask (or none).
    Sinks (s_aux) and a value head dim unlike the query's (MLA) are flash_attn_func's own checks."""
    if kwargs.get("output_attentions", False):
        raise NotImplementedError("flashattn2 does not return attention weights (output_attentions=True): use "
                                  "attn_implementation='eager' for them")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"flashattn2 takes the 2-D padding mask its registered mask function builds, got a "
                         f"{attention_mask.dim()}-D mask: was the model's mask built for another implementation?")


# ----------------------------------------------------------------------------------------------
# distributed.py (this rank's arguments; the cross-rank comparison is a collective and stays there)


def check_layout(layout: str) -> None:
    """layout is one of LAYOUTS."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def check_shards(fn: str, layout: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """One rank's q, k, v shards: dense tensors of one (batch, local_seqlen), even in the zigzag layout."""
    check_tensors(q, k, v, 4, "(batch, local_seqlen, nheads, headdim)")
    check_heads(q, k, v)
    if k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"{fn}: q, k and v must be shards of one sequence, with the same (batch, local_seqlen); "
                         f"got {tuple(q.shape[:2])}, {tuple(k.shape[:2])}, {tuple(v.shape[:2])}")
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"{fn}: a zigzag shard is two chunks of the sequence, so its length must be even, got "
                         f"local_seqlen {q.shape[1]}")


def check_ring_features(window_size: Sequence[int], alibi_slopes: torch.Tensor | None) -> None:
    """ring_flash_attn_func takes neither a window nor ALiBi."""
    if any(int(w) >= 0 for w in window_size) or alibi_slopes is not None:
        raise NotImplementedError("ring_flash_attn_func supports neither window_size nor alibi_slopes; "
                                  "ulysses_flash_attn_func supports both")


def check_ulysses_heads(nheads: int, nheads_k: int, world: int) -> None:
    """ulysses_flash_attn_func's heads share out among the ranks: nheads by world, and nheads_k by world or
    world by nheads_k."""
    if nheads % world or (nheads_k % world and world % nheads_k):
        raise ValueError(f"ulysses_flash_attn_func shares the heads among the {world} ranks: nheads ({nheads}) must "
                         f"be divisible by {world}, and nheads_k ({nheads_k}) too or {world} by it; "
                         "ring_flash_attn_func takes any head count")


# ----------------------------------------------------------------------------------------------
# FLASHATTN2_STRICT=1: the index tensors' values, on the host


def _host_values(name: str, x: torch.Tensor) -> list:
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"FLASHATTN2_STRICT=1 reads {name} on the host, which a CUDA graph capture cannot do: "
                           "unset FLASHATTN2_STRICT to capture")
    return x.tolist()


def strict_cu_seqlens(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                      total_q: int, total_k: int | None) -> list[int]:
    """ValueError naming the first bad value of cu_seqlens_q / cu_seqlens_k: each must start at 0, never
    decrease, end within its packed rows (total_k None: keys in pages, no bound) and hold no sequence longer than
    its max_seqlen. Returns the key lengths."""
    lengths = []
    for side, cu, longest, total in (("q", cu_seqlens_q, max_seqlen_q, total_q), ("k", cu_seqlens_k, max_seqlen_k,
                                                                                   total_k)):
        name = f"cu_seqlens_{side}"
        values = _host_values(name, cu)
        if values[0] != 0:
            raise ValueError(f"{name}[0] must be 0, got {values[0]}")
        lengths = [b - a for a, b in zip(values[:-1], values[1:], strict=True)]
        for i, n in enumerate(lengths):
            if n < 0:
                raise ValueError(f"{name} must not decrease: {name}[{i + 1}] = {values[i + 1]} < {name}[{i}] = "
                                 f"{values[i]}")
            if n > longest:
                raise ValueError(f"sequence {i} has {n} rows by {name}, more than max_seqlen_{side} = {longest}")
        if total is not None and values[-1] > total:
            raise ValueError(f"{name}[-1] = {values[-1]} is past the {total} packed rows")
    return lengths


def strict_block_table(block_table: torch.Tensor, lengths: list[int], page_size: int, num_blocks: int,
                       rows: list[int] | None = None) -> None:
    """ValueError naming the first page index of block_table, among the pages each sequence uses (lengths[i]
    keys, on row rows[i] of the table), that is not in [0, num_blocks)."""
    table = _host_values("block_table", block_table)
    for i, n in enumerate(lengths):
        row = i if rows is None else rows[i]
        for j, page in enumerate(table[row][:-(-n // page_size)]):
            if not 0 <= page < num_blocks:
                raise ValueError(f"block_table[{row}, {j}] = {page} is not a page of the {num_blocks}-page cache "
                                 f"(sequence {i} uses {-(-n // page_size)} pages)")


def strict_kvcache(k_cache: torch.Tensor, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, batch: int,
                   seqlen_new: int) -> None:
    """ValueError naming the first bad value of flash_attn_with_kvcache's index tensors: cache_batch_idx within the
    cache (or the block table's rows), cache_seqlens >= 0 with the appended rows within the capacity,
    cache_leftpad within [0, cache_seqlens], and every page a sequence uses within the page pool."""
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    rows = list(range(batch))
    if cache_batch_idx is not None:
        rows = _host_values("cache_batch_idx", cache_batch_idx)
        limit = block_table.shape[0] if paged else k_cache.shape[0]
        for i, r in enumerate(rows):
            if not 0 <= r < limit:
                raise ValueError(f"cache_batch_idx[{i}] = {r} is not one of the {limit} cache rows")
    seqlens = [cache_seqlens] * batch if isinstance(cache_seqlens, int) else (
        _host_values("cache_seqlens", cache_seqlens) if cache_seqlens is not None else [capacity] * batch)
    for i, n in enumerate(seqlens):
        if n < 0 or n + seqlen_new > capacity:
            raise ValueError(f"cache_seqlens[{i}] = {n} with {seqlen_new} new rows does not fit the cache "
                             f"capacity {capacity}")
    if cache_leftpad is not None:
        for i, (pad, n) in enumerate(zip(_host_values("cache_leftpad", cache_leftpad), seqlens, strict=True)):
            if not 0 <= pad <= n:
                raise ValueError(f"cache_leftpad[{i}] = {pad} must be within [0, cache_seqlens[{i}] = {n}]")
    if paged:
        strict_block_table(block_table, [n + seqlen_new for n in seqlens], k_cache.shape[1], k_cache.shape[0], rows)
