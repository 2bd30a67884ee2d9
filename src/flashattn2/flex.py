"""FlexAttention's API on flashattn2's kernels: `flex_attention` and `create_block_mask` with
torch.nn.attention.flex_attention's signatures, layout (batch, heads, seqlen, head_dim) and results, so that
switching is one import.

What runs today (docs/flex.md): a `block_mask` made by `create_block_mask` from any `mask_mod` torch can run (its
closures over captured tensors included), forward and backward, fp16/bf16, head dims up to 256, GQA with
enable_gqa, seqlen_q != seqlen_k. Key blocks the mask leaves out are never visited, full blocks skip the mask bits,
partial blocks read one bit per (query, key) that mask_mod gave once per block mask. A `score_mod` is compiled
(flashattn2.score_mod) into the kernels that run the call, Gluon or portable, its derivative too for the backward.
"""

from collections.abc import Callable
from typing import Optional

import torch
from torch.nn.attention.flex_attention import BlockMask
from torch.nn.attention.flex_attention import create_block_mask as _torch_create_block_mask

from .checks import check_gqa, check_tensors
from .kernels.backends import flex_backward, flex_forward
from .kernels.launch import PlanCache
from .kernels.portable.flex import partial_block_bits, transposed_partial_ids
from .ops import is_traced
from .score_mod import compile_score_mod

__all__ = ["BlockMask", "create_block_mask", "flex_attention"]

# partial-block bits per block mask, made once: mask_mod runs on the host side (a sync, outside CUDA graphs)
_bits = PlanCache(limit=64)


def create_block_mask(mask_mod: Callable, B: int | None, H: int | None, Q_LEN: int, KV_LEN: int,
                      device: str | torch.device = "cuda", BLOCK_SIZE: int | tuple[int, int] = 128,
                      _compile: bool = False) -> BlockMask:
    """torch.nn.attention.flex_attention.create_block_mask: the BlockMask of mask_mod(b, h, q_idx, kv_idx) (True
    where query q_idx may see key kv_idx) over B batches and H heads (None: the same for all). _compile: make it
    with torch.compile, without a Q_LEN x KV_LEN mask in memory (what long sequences need)."""
    return _torch_create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=device, BLOCK_SIZE=BLOCK_SIZE,
                                    _compile=_compile)


def _checked_mask(block_mask: BlockMask, batch: int, nheads: int, seqlen_q: int, seqlen_k: int) -> None:
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a BlockMask (create_block_mask makes one), got "
                        f"{type(block_mask).__name__}")
    if tuple(block_mask.seq_lengths) != (seqlen_q, seqlen_k):
        raise ValueError(f"block_mask was made for (Q_LEN, KV_LEN) = {tuple(block_mask.seq_lengths)}, but query and "
                         f"key have {seqlen_q} and {seqlen_k} rows: make it with create_block_mask(..., {seqlen_q}, "
                         f"{seqlen_k})")
    mask_b, mask_h = block_mask.kv_num_blocks.shape[:2]
    if mask_b not in (1, batch) or mask_h not in (1, nheads):
        raise ValueError(f"block_mask is for B={mask_b}, H={mask_h}; the query has batch {batch} and {nheads} heads "
                         f"(B and H must match them or be 1)")
    sparse_q, sparse_kv = block_mask.BLOCK_SIZE
    if sparse_q < 16 or sparse_q & (sparse_q - 1) or sparse_kv < 32 or sparse_kv & (sparse_kv - 1):
        raise ValueError(f"block_mask.BLOCK_SIZE must be powers of two, at least 16 query and 32 key rows, got "
                         f"{block_mask.BLOCK_SIZE}")


def _mask_bits(block_mask: BlockMask, seqlen_q: int, seqlen_k: int, ident: int | None = None):
    """(ids, words, transposed ids) of a block mask, made once per mask: `ident` names it (default its id; the
    traced ops pass their mask_mod's key, their lists being new objects at each call)."""
    key = (id(block_mask) if ident is None else ident, block_mask.kv_indices.data_ptr(),
           block_mask.kv_num_blocks.data_ptr(), block_mask.kv_indices._version, seqlen_q, seqlen_k)
    hit = _bits.get(key)
    if hit is None:
        # the mask (its tensors) is kept in the entry, so that neither its id nor its storage is reused while the
        # entry lives
        ids, words = partial_block_bits(block_mask, seqlen_q, seqlen_k)
        hit = _bits.add(key, (block_mask, (ids, words, transposed_partial_ids(block_mask, ids))))
    return hit[1]


_mods = PlanCache(limit=64)


def _compiled_mod(score_mod: Callable, device: torch.device):
    """score_mod's Triton functions, made once per function and captured tensors (a closure rebound to other
    tensors is a new entry)."""
    cells = tuple(id(cell.cell_contents) for cell in (score_mod.__closure__ or ()))
    key = (id(score_mod), cells, str(device))
    hit = _mods.get(key)
    if hit is None:
        # the function is kept in the entry, so that its id is not reused while the entry lives
        hit = _mods.add(key, (score_mod, compile_score_mod(score_mod, device)))
    return hit[1]


class _FlexAttention(torch.autograd.Function):
    """flex_forward with its backward (flex_backward) for inputs that require grad."""

    @staticmethod
    def forward(ctx, query, key, value, block_mask, scale, bits, mod):
        out, lse = flex_forward(query, key, value, block_mask, scale, bits[:2], mod)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.block_mask, ctx.scale, ctx.bits, ctx.mod = block_mask, scale, bits, mod
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        query, key, value, out, lse = ctx.saved_tensors
        ids, words, q_ids = ctx.bits
        dq, dk, dv = flex_backward(dout, query, key, value, out, lse, ctx.block_mask, ctx.scale, (ids, words), q_ids,
                                   ctx.mod)
        return dq, dk, dv, None, None, None, None


def flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod: Callable | None = None,
                   block_mask: BlockMask | None = None, scale: float | None = None, enable_gqa: bool = False,
                   return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """torch.nn.attention.flex_attention.flex_attention: softmax(query key^T scale, masked by block_mask) value.

    Arguments:
        query: (batch, heads, seqlen_q, head_dim); key, value: (batch, heads_k, seqlen_k, head_dim).
        score_mod: score_mod(score, b, h, q_idx, kv_idx) -> the score to use, applied to query key^T scale before
            the mask; closures over captured tensors are fine (flashattn2.score_mod compiles it; an op it does not
            support raises NotImplementedError naming it). Gradients flow through it to query and key.
        block_mask: a BlockMask from create_block_mask for (seqlen_q, seqlen_k); None: every key is seen.
        scale: the scores' factor; default 1 / sqrt(head_dim).
        enable_gqa: let heads_k divide heads (query head h reads key head h // (heads / heads_k)).
        return_lse: also return the log-sum-exp of the scores (natural log), (batch, heads, seqlen_q) float32.
    Return:
        out (batch, heads, seqlen_q, head_dim), and lse with return_lse. Rows that see no key give out 0 and lse
        -inf, as FlexAttention gives.
    """
    check_tensors(query, key, value, 4, "(batch, heads, seqlen, head_dim)")
    batch, nheads, seqlen_q, head_dim = query.shape
    _, nheads_k, seqlen_k, _ = key.shape
    if key.shape[0] != batch or value.shape[:3] != key.shape[:3] or key.shape[3] != head_dim or \
            value.shape[3] != head_dim:
        raise ValueError(f"query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} must "
                         f"share batch and head_dim, and key and value their heads and seqlen")
    if head_dim > 256:
        raise ValueError(f"head_dim must be at most 256, got {head_dim}")
    if nheads_k != nheads:
        if not enable_gqa:
            raise ValueError(f"query has {nheads} heads and key {nheads_k}: pass enable_gqa=True for grouped-query "
                             f"attention")
        check_gqa(nheads, nheads_k)
    if scale is None:
        scale = head_dim ** -0.5
    elif not scale > 0.0:
        raise ValueError(f"scale must be positive, got {scale}")
    if block_mask is not None:
        _checked_mask(block_mask, batch, nheads, seqlen_q, seqlen_k)
        if block_mask.kv_indices.device != query.device:
            raise ValueError(f"block_mask is on {block_mask.kv_indices.device}, the inputs on {query.device}")
    if is_traced(query):
        # torch.compile and other tracing: one opaque op each way, the callables named by constant keys (no lists:
        # no block mask)
        lists, block_size = ([], [128, 128]) if block_mask is None else (_mask_lists(block_mask),
                                                                          list(block_mask.BLOCK_SIZE))
        out, lse = torch.ops.flashattn2.flex_fwd(query, key, value, lists, block_size, float(scale),
                                                  _key(None if block_mask is None else block_mask.mask_mod),
                                                  _key(score_mod))
        return (out, lse) if return_lse else out
    if block_mask is None:
        block_mask = _full_mask(seqlen_q, seqlen_k, query.device)
    bits = _mask_bits(block_mask, seqlen_q, seqlen_k)
    mod = None if score_mod is None else _compiled_mod(score_mod, query.device)
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        out, lse = _FlexAttention.apply(query, key, value, block_mask, float(scale), bits, mod)
    else:
        out, lse = flex_forward(query, key, value, block_mask, float(scale), bits[:2], mod)
    return (out, lse) if return_lse else out


_full_masks = PlanCache(limit=64)


def _full_mask(seqlen_q: int, seqlen_k: int, device: torch.device) -> BlockMask:
    """A block mask that sees every key: every block full."""
    key = (seqlen_q, seqlen_k, str(device))
    hit = _full_masks.get(key)
    if hit is None:
        hit = _full_masks.add(key, create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= 0, None, None, seqlen_q,
                                                     seqlen_k, device=device))
    return hit


# ----------------------------------------------------------------------------------------------
# the custom ops, for tracing (torch.compile, fake tensors): flex_fwd and flex_bwd take the block mask's lists as
# tensors and its mask_mod and the score_mod as keys into _callables, so that a traced graph holds no Python
# callable; the ops' real implementations are flex_forward / flex_backward above with the same caches.

_callables: dict[int, Callable] = {}


@torch._dynamo.assume_constant_result
def _key(fn: Callable | None) -> int:
    """An int naming fn in the ops' calls (0 for None): a traced graph keeps it as a constant; fn stays alive."""
    if fn is None:
        return 0
    _callables[id(fn)] = fn
    return id(fn)


_LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
          "full_q_num_blocks", "full_q_indices")


def _mask_lists(block_mask: BlockMask) -> list[torch.Tensor | None]:
    return [getattr(block_mask, name) for name in _LISTS]


class _ListsMask:
    """A block mask rebuilt from the ops' arguments: the attributes the kernels read."""

    def __init__(self, lists, block_size, seqlen_q: int, seqlen_k: int, mask_mod: int):
        for name, x in zip(_LISTS, lists, strict=True):
            setattr(self, name, x)
        self.BLOCK_SIZE = tuple(block_size)
        self.seq_lengths = (seqlen_q, seqlen_k)
        self.mask_mod = _callables[mask_mod]


def _op_inputs(query, key, lists, block_size, mask_mod: int, score_mod: int):
    """(the rebuilt mask, its bits, the compiled score_mod or None) of an op call; no lists: no block mask."""
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    if lists:
        block_mask = _ListsMask(lists, block_size, seqlen_q, seqlen_k, mask_mod)
        bits = _mask_bits(block_mask, seqlen_q, seqlen_k, ident=mask_mod)
    else:
        block_mask = _full_mask(seqlen_q, seqlen_k, query.device)
        bits = _mask_bits(block_mask, seqlen_q, seqlen_k)
    mod = _compiled_mod(_callables[score_mod], query.device) if score_mod else None
    return block_mask, bits, mod


@torch.library.custom_op("flashattn2::flex_fwd", mutates_args=())
def _flex_fwd_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lists: list[Optional[torch.Tensor]],
                 block_size: list[int], scale: float, mask_mod: int,
                 score_mod: int) -> tuple[torch.Tensor, torch.Tensor]:
    block_mask, bits, mod = _op_inputs(query, key, lists, block_size, mask_mod, score_mod)
    return flex_forward(query, key, value, block_mask, scale, bits[:2], mod)


@_flex_fwd_op.register_fake
def _flex_fwd_fake(query, key, value, lists, block_size, scale, mask_mod, score_mod):
    return torch.empty_like(query), query.new_empty(query.shape[:3], dtype=torch.float32)


@torch.library.custom_op("flashattn2::flex_bwd", mutates_args=())
def _flex_bwd_op(dout: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, lists: list[Optional[torch.Tensor]], block_size: list[int], scale: float,
                 mask_mod: int, score_mod: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    block_mask, bits, mod = _op_inputs(query, key, lists, block_size, mask_mod, score_mod)
    return flex_backward(dout, query, key, value, out, lse, block_mask, scale, bits[:2], bits[2], mod)


@_flex_bwd_op.register_fake
def _flex_bwd_fake(dout, query, key, value, out, lse, lists, block_size, scale, mask_mod, score_mod):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _flex_setup_context(ctx, inputs, output):
    query, key, value, lists, block_size, scale, mask_mod, score_mod = inputs
    out, lse = output
    present = [x for x in lists if x is not None]
    ctx.save_for_backward(query, key, value, out, lse, *present)
    ctx.lists_present = [x is not None for x in lists]  # empty: no block mask
    ctx.args = (block_size, scale, mask_mod, score_mod)
    ctx.mark_non_differentiable(lse)


def _flex_op_backward(ctx, dout, _dlse):
    query, key, value, out, lse, *present = ctx.saved_tensors
    present = iter(present)
    lists = [next(present) if here else None for here in ctx.lists_present]
    dq, dk, dv = _flex_bwd_op(dout.contiguous(), query, key, value, out, lse, lists, *ctx.args)
    return dq, dk, dv, [None] * len(lists), None, None, None, None


_flex_fwd_op.register_autograd(_flex_op_backward, setup_context=_flex_setup_context)
