"""flashattn2 as the kernels of PyTorch's SDPA FLASH_ATTENTION backend (torch >= 2.10).

    import flashattn2.sdpa_backend as fa2_sdpa
    fa2_sdpa.activate()  # or torch.nn.attention.activate_flash_attention_impl("FLASHATTN2")

Importing this module registers flashattn2 with torch's flash attention registry; it never activates it.
Once active, the CUDA kernels of the aten ops behind FLASH_ATTENTION (the ones torch's own FA4 provider
replaces) call flashattn2; restore() drops them, and torch's kernels are back.

The aten flash ops' causal mask is aligned to the bottom-right corner (torch's flash kernel is FlashAttention-2's),
as is flash_attn_func's; torch's SDPA never sends causal calls with seqlen_q != seqlen_k to FLASH_ATTENTION.
"""

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.attention
from torch.library import Library

from . import ops
from .checks import attn_options, check_dense, check_sdpa, check_varlen, unit_last_stride
from .interface import flash_attn_func, flash_attn_varlen_func
from .kernels.params import AttnOptions

NAME = "FLASHATTN2"


def _torch_fn(name: str, since: str):
    """torch.nn.attention.<name>, looked up per call (so an old torch fails at the call, not at import)."""
    fn = getattr(torch.nn.attention, name, None)
    if fn is None:
        raise RuntimeError(f"flashattn2's SDPA backend needs torch >= {since} (torch.nn.attention.{name}); this is "
                           f"torch {torch.__version__}")
    return fn


def register(name: str = NAME) -> None:
    """
    Register flashattn2 as the flash attention impl ``name``, without activating it.

    Args:
        name: Implementation identifier for :func:`torch.nn.attention.activate_flash_attention_impl`.
    """
    _torch_fn("register_flash_attention_impl", "2.10")(name, register_fn=_register_kernels)


def activate(name: str = NAME) -> None:
    """
    Activate flashattn2 (registered as ``name``) into the dispatcher, in place of whatever impl was active.

    Args:
        name: Implementation identifier given to :func:`register`.
    """
    _torch_fn("activate_flash_attention_impl", "2.10")(name)


def restore() -> None:
    """
    Restore torch's default flash attention kernels, whichever impl is active.
    """
    _torch_fn("restore_flash_attention_impl", "2.11")()


@contextlib.contextmanager
def sdpa_flash_backend(name: str = NAME) -> Iterator[None]:
    """
    Activate flashattn2 for the duration of the block, then give back the impl that was active before it
    (torch's default when there was none).

    Args:
        name: Implementation identifier given to :func:`register`.

    Example:
        >>> with sdpa_flash_backend(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # doctest: +SKIP
        ...     out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    """
    previous = _torch_fn("current_flash_attention_impl", "2.10")()
    restore_default = _torch_fn("restore_flash_attention_impl", "2.11")  # refuse before activating anything
    try:
        if previous != name:
            activate(name)  # inside: torch drops the previous impl before it finds out `name` is unknown
        yield
    finally:
        if previous is None:
            restore_default()
        elif previous != name:
            activate(previous)


class _Handle:
    """What activation returns to torch's registry: remove() drops the overrides."""

    def __init__(self, library: Library):
        self.library: Library | None = library

    def remove(self) -> None:
        # destroyed now rather than when garbage-collected, so that torch's kernels are back on return
        if self.library is not None:
            self.library._destroy()
            self.library = None


def _register_kernels(dispatch_key: str = "CUDA") -> _Handle:
    """Override the aten flash ops of this torch for ``dispatch_key`` (the tests use "CPU", for the interpreter)."""
    library = Library("aten", "IMPL", dispatch_key)
    for op, impl in _IMPLS.items():
        if hasattr(torch.ops.aten, op):  # torch 2.11 may lack the newer ops
            library.impl(op, impl, dispatch_key)
    return _Handle(library)


# ----------------------------------------------------------------------------------------------
# shared by the ops


class _Call(NamedTuple):
    """An aten call's options in flash_attn's terms."""

    dropout_p: float
    causal: bool
    scale: float | None
    window: tuple[int, int] = (-1, -1)
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0

    def options(self, q: torch.Tensor, k: torch.Tensor, deterministic: bool = False) -> AttnOptions:
        max_q, max_k = self.max_seqlen_q, self.max_seqlen_k
        if self.cu_seqlens_q is None:  # a dense call's max_seqlens are its seqlens, as flash_attn_func takes them
            max_q, max_k = q.shape[1], k.shape[1]
        return attn_options(q, self.cu_seqlens_q, self.cu_seqlens_k, max_q, max_k, self.dropout_p, self.scale,
                            self.causal, self.window, 0.0, None, deterministic)


def _flash_call(op: str, unknown: dict, *, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, scale,
                window_size_left, window_size_right, **unsupported) -> _Call:
    """The _Call of an aten _flash_attention_* op, after refusing what flashattn2 cannot honour."""
    _refuse(op, unknown, **unsupported)
    if (cum_seq_q is None) != (cum_seq_k is None):
        raise ValueError(f"aten::{op}: cum_seq_q and cum_seq_k must be given together (packed sequences) or not at all")
    window = tuple(-1 if w is None else int(w) for w in (window_size_left, window_size_right))
    return _Call(float(dropout_p), bool(is_causal), scale, window, cum_seq_q, cum_seq_k, int(max_q), int(max_k))


# why each argument is refused, by name; an argument of another torch version is refused by name too
_REFUSED = {
    "return_debug_mask": "return_debug_mask=True (flashattn2 does not build torch's debug attention mask; "
                         "flashattn2.flash_attn_func(return_attn_probs=True) returns the probabilities)",
    "seqused_k": "seqused_k (pass cum_seq_k of the keys in use)",
    "alibi_slopes": "alibi_slopes (aten::_flash_attention_backward takes none, so its gradients would be wrong: "
                    "call flashattn2.flash_attn_func(alibi_slopes=...))",
    "block_table": "block_table (a paged KV cache: call flashattn2.flash_attn_varlen_func(block_table=...))",
}


def _refuse(op: str, unknown: dict, **arguments) -> None:
    """NotImplementedError naming every argument of `arguments` set to anything but None or False, and every one
    of `unknown` (the dispatcher passes only those that differ from their defaults)."""
    given = [name for name, value in arguments.items() if value is not None and value is not False] + list(unknown)
    if given:
        why = "; ".join(_REFUSED.get(name, f"{name} (an argument of torch {torch.__version__} flashattn2 does not "
                                           "know)") for name in given)
        raise NotImplementedError(f"flashattn2's SDPA backend (aten::{op}) does not support {why}")


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: _Call):
    """(out, lse, rng_state) for flash_attn's layouts; rng_state is torch's (2,) uint64, with dropout's seed first."""
    with torch.no_grad():  # aten's autograd formula calls the backward op: record no graph of our own
        if call.dropout_p == 0.0:
            kwargs = dict(softmax_scale=call.scale, causal=call.causal, window_size=call.window, return_attn_probs=True)
            if call.cu_seqlens_q is None:
                out, lse, _ = flash_attn_func(q, k, v, **kwargs)
            else:
                out, lse, _ = flash_attn_varlen_func(q, k, v, call.cu_seqlens_q, call.cu_seqlens_k, call.max_seqlen_q,
                                                     call.max_seqlen_k, **kwargs)
            # torch's layout, unread without dropout (torch leaves it uninitialised too)
            return out, lse, torch.empty(2, dtype=torch.uint64, device=q.device)
        # flash_attn_func draws dropout's seed itself and does not return it; the backward needs it
        if call.cu_seqlens_q is None:
            check_dense(q, k, v)
        else:
            check_varlen(q, k, v, call.cu_seqlens_q, call.cu_seqlens_k, call.max_seqlen_q, call.max_seqlen_k)
        q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
        rng = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=q.device)  # [seed, unread]: one launch
        out, lse, _ = ops.forward(q, k, v, call.options(q, k)._replace(rng_seed=rng[:1]))
        return out, lse, rng.view(torch.uint64)


def _backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
              lse: torch.Tensor, call: _Call, rng_state: torch.Tensor):
    """(dq, dk, dv) in flash_attn's layouts, from the forward's out, lse and rng_state."""
    q, k, v, out = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v), unit_last_stride(out)
    opts = call.options(q, k, deterministic=torch.are_deterministic_algorithms_enabled())
    if call.dropout_p > 0.0:
        if rng_state.dtype not in (torch.uint64, torch.int64) or rng_state.numel() != 2:
            raise ValueError(f"rng_state must be the (2,) uint64 tensor the forward returned, got {rng_state.dtype} "
                             f"{tuple(rng_state.shape)}")
        opts = opts._replace(rng_seed=rng_state.view(torch.int64)[:1])
    # ops.backward rather than torch.ops.flashattn2.bwd: these are real tensors, below autograd
    return ops.backward(dout, q, k, v, out, lse, opts)


def _laid_out_like(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """x, or a copy of it with torch.empty_like(ref)'s strides: torch's meta functions promise that layout, and
    torch.compile's generated code indexes the result by it."""
    if x.stride() == torch.empty_like(ref, device="meta").stride():
        return x
    return torch.empty_like(ref).copy_(x)


def _unused_and_debug_mask(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's `unused` (a uint64 scalar) and empty debug mask."""
    return torch.empty((), dtype=torch.uint64, device=q.device), torch.empty(0, dtype=q.dtype, device=q.device)


# ----------------------------------------------------------------------------------------------
# the aten ops: parameter names, kinds and defaults are the schemas' (the dispatcher passes keyword-only
# arguments by name and leaves out those at their defaults); **unknown takes another torch's extra ones


def _flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                             return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                             seqused_k=None, alibi_slopes=None, block_table=None, num_splits=None, **unknown):
    # num_splits is a speed hint (split-KV decoding): the kernels choose their own split, with the same result
    call = _flash_call("_flash_attention_forward", unknown, cum_seq_q=cum_seq_q, cum_seq_k=cum_seq_k, max_q=max_q,
                       max_k=max_k, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                       window_size_left=window_size_left, window_size_right=window_size_right,
                       return_debug_mask=return_debug_mask, seqused_k=seqused_k, alibi_slopes=alibi_slopes,
                       block_table=block_table)
    out, lse, rng_state = _forward(query, key, value, call)
    return (_laid_out_like(out, query), lse, rng_state, *_unused_and_debug_mask(query))


def _flash_attention_forward_no_dropout_inplace(out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                                is_causal, return_debug_mask, *, scale=None, window_size_left=None,
                                                window_size_right=None, seqused_k=None, alibi_slopes=None,
                                                block_table=None, num_splits=None, **unknown):
    op = "_flash_attention_forward_no_dropout_inplace"
    if dropout_p != 0.0:
        raise ValueError(f"aten::{op} takes dropout_p=0 (it returns no rng state for a backward), got {dropout_p}")
    call = _flash_call(op, unknown, cum_seq_q=cum_seq_q, cum_seq_k=cum_seq_k, max_q=max_q, max_k=max_k, dropout_p=0.0,
                       is_causal=is_causal, scale=scale, window_size_left=window_size_left,
                       window_size_right=window_size_right, return_debug_mask=return_debug_mask,
                       seqused_k=seqused_k, alibi_slopes=alibi_slopes, block_table=block_table)
    result, lse, _ = _forward(query, key, value, call)
    out.copy_(result)  # the kernels allocate their output
    return lse


def _flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                              dropout_p, is_causal, rng_state, unused, *, scale=None, window_size_left=None,
                              window_size_right=None, **unknown):
    call = _flash_call("_flash_attention_backward", unknown, cum_seq_q=cum_seq_q, cum_seq_k=cum_seq_k, max_q=max_q,
                       max_k=max_k, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                       window_size_left=window_size_left, window_size_right=window_size_right)
    grads = _backward(grad_out, query, key, value, out, logsumexp, call, rng_state)
    return tuple(_laid_out_like(g, x) for g, x in zip(grads, (query, key, value), strict=True))


def _scaled_dot_product_flash_attention(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                                        *, scale=None, **unknown):
    _refuse("_scaled_dot_product_flash_attention", unknown, return_debug_mask=return_debug_mask)
    check_sdpa(query, key, value, None, True)
    # (batch, heads, seqlen, dim) as transposed views of flash_attn's (batch, seqlen, heads, dim)
    call = _Call(float(dropout_p), bool(is_causal), scale)
    out, lse, rng_state = _forward(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), call)
    max_q, max_k = query.shape[2], key.shape[2]
    return (_laid_out_like(out.transpose(1, 2), query), lse, None, None, max_q, max_k, rng_state,
            *_unused_and_debug_mask(query))


def _scaled_dot_product_flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                                                 max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *,
                                                 scale=None, **unknown):
    _refuse("_scaled_dot_product_flash_attention_backward", unknown)
    call = _Call(float(dropout_p), bool(is_causal), scale)
    grads = _backward(grad_out.transpose(1, 2), query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                      out.transpose(1, 2), logsumexp, call, philox_seed)
    return tuple(_laid_out_like(g.transpose(1, 2), x) for g, x in zip(grads, (query, key, value), strict=True))


# the ops torch's FA4 provider overrides, by aten name
_IMPLS = {
    "_flash_attention_forward": _flash_attention_forward,
    "_flash_attention_forward_no_dropout_inplace": _flash_attention_forward_no_dropout_inplace,
    "_flash_attention_backward": _flash_attention_backward,
    "_scaled_dot_product_flash_attention": _scaled_dot_product_flash_attention,
    "_scaled_dot_product_flash_attention_backward": _scaled_dot_product_flash_attention_backward,
}

if hasattr(torch.nn.attention, "register_flash_attention_impl"):
    register()
