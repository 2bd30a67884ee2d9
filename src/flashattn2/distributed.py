"""Context parallelism: exact attention over a sequence whose shards live on the ranks of a process group.

    from flashattn2.distributed import ring_flash_attn_func, shard_sequence, unshard_sequence
    q, k, v = (shard_sequence(x) for x in (q_full, k_full, v_full))  # (batch, seqlen / W, nheads, headdim)
    out = ring_flash_attn_func(q, k, v, causal=True)                  # this rank's shard of the output

- ring_flash_attn_func: the K/V shards travel around the ring of ranks while each rank attends its queries
  to the shard it holds (the transfer of the next shard overlaps the attention to this one); the partial
  results merge by their log-sum-exp. Any head count; no window, ALiBi or packed sequences.
- ulysses_flash_attn_func: an all-to-all turns sequence shards into head shards, flash_attn_func attends
  over the whole sequence for 1/W of the heads, and a second all-to-all turns the output back. The heads
  must divide among the ranks; every feature of flash_attn_func.

Layouts of the shards: "zigzag" cuts the sequence into 2W chunks and rank r holds chunks r and 2W-1-r, so
that under a causal mask every rank has the same work; "contiguous": rank r holds chunk r.

Each call first compares the shapes, dtypes and devices of the ranks' shards: a host-side all_gather of a
few integers on a CPU (gloo) group, so that bad input raises the same error on every rank instead of
leaving the others waiting in a collective. The other arguments must be the same on every rank.
"""

import atexit

import torch
import torch.distributed as dist

from . import ops
from .checks import (
    LAYOUTS,
    attn_options,
    check_layout,
    check_ring_features,
    check_shards,
    check_ulysses_heads,
    unit_last_stride,
)
from .interface import flash_attn_func
from .kernels.params import AttnOptions

# ----------------------------------------------------------------------------------------------
# layouts


def rank_chunks(rank: int, world: int, layout: str) -> tuple[int, ...]:
    """The chunks of the global sequence that `rank` holds, in its local order: (rank, 2W-1-rank) for
    "zigzag" (the sequence cut into 2W chunks), (rank,) for "contiguous" (cut into W)."""
    return (rank, 2 * world - 1 - rank) if layout == "zigzag" else (rank,)


def _chunk_len(seqlen: int, world: int, layout: str) -> int:
    chunks = world * len(rank_chunks(0, world, layout))
    if seqlen % chunks:
        raise ValueError(f"a sequence of length {seqlen} does not shard over {world} ranks in the {layout!r} "
                         f"layout: that cuts it into {chunks} equal chunks")
    return seqlen // chunks


def _local_shard(x: torch.Tensor, dim: int, rank: int, world: int, layout: str) -> torch.Tensor:
    size = _chunk_len(x.shape[dim], world, layout)
    return torch.cat([x.narrow(dim, c * size, size) for c in rank_chunks(rank, world, layout)], dim)


def _layout_order(world: int, layout: str) -> list[int]:
    """The global chunks in the order of the ranks' shards concatenated in rank order."""
    return [c for r in range(world) for c in rank_chunks(r, world, layout)]


def _to_natural(x: torch.Tensor, dim: int, world: int, layout: str) -> torch.Tensor:
    """The ranks' shards concatenated in rank order along dim -> the sequence in its own order."""
    order = _layout_order(world, layout)
    if order == sorted(order):
        return x
    pieces = x.chunk(len(order), dim)
    return torch.cat([pieces[order.index(c)] for c in range(len(order))], dim)


def _from_natural(x: torch.Tensor, dim: int, world: int, layout: str) -> torch.Tensor:
    """The inverse of _to_natural: the sequence -> the ranks' shards concatenated in rank order."""
    order = _layout_order(world, layout)
    if order == sorted(order):
        return x
    pieces = x.chunk(len(order), dim)
    return torch.cat([pieces[c] for c in order], dim)


def shard_sequence(x: torch.Tensor, dim: int = 1, group: dist.ProcessGroup | None = None,
                   layout: str = "zigzag") -> torch.Tensor:
    """This rank's shard of a sequence that every rank holds whole (a copy, with autograd).

    Arguments:
        x: the whole tensor, the same on every rank, e.g. q (batch_size, seqlen, nheads, headdim).
        dim: int. The sequence dimension.
        group: the process group (None: the default group).
        layout: "zigzag" (rank r holds chunks r and 2W-1-r of 2W) or "contiguous" (chunk r of W).
    Return:
        (batch_size, seqlen / W, nheads, headdim) for dim=1. ValueError when seqlen is not a multiple of
        2W (zigzag) or W (contiguous).
    """
    check_layout(layout)
    return _local_shard(x, dim % x.dim(), dist.get_rank(group), dist.get_world_size(group), layout)


class _Unshard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, layout):
        world = dist.get_world_size(group)
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x, group=group)
        ctx.dim, ctx.group, ctx.layout = dim, group, layout
        return _to_natural(torch.cat(parts, dim), dim, world, layout)

    @staticmethod
    def backward(ctx, grad):
        # every rank backpropagates the same gradient of the whole tensor: this rank's part is its shard
        rank, world = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        return _local_shard(grad, ctx.dim, rank, world, ctx.layout), None, None, None


def unshard_sequence(x_local: torch.Tensor, dim: int = 1, group: dist.ProcessGroup | None = None,
                     layout: str = "zigzag") -> torch.Tensor:
    """The whole sequence from every rank's shard (an all_gather), with autograd.

    Its backward returns this rank's shard of the gradient of the whole tensor: it assumes that what
    follows is replicated, every rank backpropagating the same gradient (as in a loss computed on
    every rank from the gathered tensor).

    Arguments:
        x_local: this rank's shard, e.g. (batch_size, seqlen / W, nheads, headdim); the same shape on
            every rank (checked: ValueError on every rank otherwise).
        dim: int. The sequence dimension.
        group: the process group (None: the default group).
        layout: the layout the shards are in, as for shard_sequence.
    Return:
        (batch_size, seqlen, nheads, headdim) for dim=1, in the sequence's own order.
    """
    check_layout(layout)
    _check_same_across_ranks("unshard_sequence", group, x_local=x_local)
    if dist.get_world_size(group) == 1:
        return x_local
    return _Unshard.apply(x_local, dim % x_local.dim(), group, layout)


# ----------------------------------------------------------------------------------------------
# the cross-rank check of the inputs

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # any other dtype is code 4
_DEVICE_TYPES = ("cpu", "cuda")
_FIELDS = 7  # ndim, 4 sizes, dtype, device type
_cpu_groups: dict[dist.ProcessGroup, dist.ProcessGroup] = {}
# dropped before the interpreter's teardown: a process group destroyed then would abort the process
atexit.register(_cpu_groups.clear)


def _cpu_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The group itself where it takes CPU tensors, else a gloo group of the same ranks, made on the first
    call: every rank of the group makes it then, since every call starts with the check."""
    if "gloo" in str(dist.get_backend(group)):
        return group
    group = group or dist.group.WORLD
    if group not in _cpu_groups:  # by the group object: a process group made anew gets a side group anew
        ranks = dist.get_process_group_ranks(group)
        _cpu_groups[group] = dist.new_group(ranks, backend="gloo", use_local_synchronization=True)
    return _cpu_groups[group]


def _describe(x) -> list[int]:
    if not isinstance(x, torch.Tensor):
        return [-1] * _FIELDS
    sizes = list(x.shape[:4]) + [-1] * (4 - min(x.dim(), 4))
    dtype = _DTYPES.index(x.dtype) if x.dtype in _DTYPES else len(_DTYPES)
    device = x.device.type
    return [x.dim(), *sizes, dtype, _DEVICE_TYPES.index(device) if device in _DEVICE_TYPES else 2]


def _render(fields: list[int]) -> str:
    ndim, sizes, dtype, device = fields[0], fields[1:5], fields[5], fields[6]
    if ndim < 0:
        return "not a tensor"
    shape = tuple(sizes[:min(ndim, 4)]) + (("...",) if ndim > 4 else ())
    dtype_name = str(_DTYPES[dtype]).removeprefix("torch.") if dtype < len(_DTYPES) else "other dtype"
    return f"{shape} {dtype_name} {_DEVICE_TYPES[device] if device < 2 else 'other device'}"


def _check_same_across_ranks(fn: str, group: dist.ProcessGroup | None, **tensors) -> None:
    """ValueError on every rank unless every rank's tensors have the same shapes, dtypes and device types."""
    world = dist.get_world_size(group)
    if world == 1:
        return
    mine = torch.tensor([f for x in tensors.values() for f in _describe(x)], dtype=torch.int64)
    rows = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(rows, mine, group=_cpu_group(group))
    if all(torch.equal(row, rows[0]) for row in rows):
        return
    names = list(tensors)
    ranks = "; ".join(
        f"rank {r}: " + ", ".join(f"{name} {_render(row[i * _FIELDS:(i + 1) * _FIELDS].tolist())}"
                                  for i, name in enumerate(names))
        for r, row in enumerate(rows))
    raise ValueError(f"{fn}: the ranks' shards differ; every rank must pass the same shapes, dtypes and "
                     f"devices ({ranks})")


def _check_shards(fn: str, group: dist.ProcessGroup | None, layout: str, q: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor) -> None:
    _check_same_across_ranks(fn, group, q=q, k=k, v=v)
    # from here on every rank's inputs have the same shapes, dtypes and devices: every rank decides alike
    check_shards(fn, layout, q, k, v)


# ----------------------------------------------------------------------------------------------
# ring attention


def ring_block(rank: int, source: int, world: int, layout: str, causal: bool,
               seqlen: int) -> tuple[slice, slice, bool] | None:
    """The part of the attention of `rank`'s queries to the keys of `source`'s shard that is computed:
    (query rows, key rows, causal within the block), local positions of shards of length `seqlen`, or
    None where no query sees any of those keys."""
    every = slice(0, seqlen)
    if source == rank:
        # a shard's positions increase along it (zigzag: chunk r precedes chunk 2W-1-r), so causal is local
        return every, every, causal
    if not causal:
        return every, every, False
    if layout == "contiguous":
        return (every, every, False) if source < rank else None
    half = seqlen // 2
    if source < rank:
        # the source's first chunk precedes both of ours, its second follows both
        return every, slice(0, half), False
    # both of the source's chunks follow our first chunk and precede our second
    return slice(half, seqlen), every, False


class _Ring:
    """This rank's neighbours on the ring of `group`, by global rank (what P2POp takes)."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        whole = group or dist.group.WORLD
        self.next = dist.get_global_rank(whole, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(whole, (self.rank - 1) % self.world)

    def pass_on(self, x: torch.Tensor) -> tuple[torch.Tensor, list]:
        """Start sending x to the next rank and receiving the previous rank's x: (buffer, works to wait)."""
        received = torch.empty_like(x)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, self.next, self.group),
                                        dist.P2POp(dist.irecv, received, self.prev, self.group)])
        return received, works

    def block(self, step: int, causal: bool, layout: str, seqlen: int):
        """ring_block of the shard held at `step` (the one that started `step` ranks back)."""
        return ring_block(self.rank, (self.rank - step) % self.world, self.world, layout, causal, seqlen)


def _wait(works: list) -> None:
    for work in works:
        work.wait()


def _block_opts(opts: AttnOptions, rows: slice, keys: slice, causal: bool) -> AttnOptions:
    return opts._replace(window_right=0 if causal else -1, max_seqlen_q=rows.stop - rows.start,
                         max_seqlen_k=keys.stop - keys.start)


def _merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor,
           rows: slice) -> None:
    """Fold one block's result on `rows` into the running fp32 (out, lse), in place. No lse is infinite:
    without a window every row of every block sees at least one key."""
    total = torch.logaddexp(lse[:, :, rows], block_lse)
    share = torch.exp(block_lse - total)  # the block's part of the rows' softmax mass
    out[:, rows].lerp_(block_out.float(), share.transpose(1, 2).unsqueeze(-1))
    lse[:, :, rows] = total


def _ring_forward(q: torch.Tensor, kv: torch.Tensor, opts: AttnOptions, ring: _Ring, layout: str):
    """(out in q's dtype, lse fp32) of this rank's queries over every shard of kv (2, batch, seqlen, ...)."""
    seqlen = q.shape[1]
    out = lse = None
    for step in range(ring.world):
        last = step == ring.world - 1
        if not last:
            next_kv, works = ring.pass_on(kv)  # started first, so that the transfer overlaps the attention
        block = ring.block(step, opts.causal, layout, seqlen)
        if block is not None:
            rows, keys, causal = block
            block_out, block_lse, _ = ops.forward(q[:, rows], kv[0, :, keys], kv[1, :, keys],
                                                  _block_opts(opts, rows, keys, causal))
            if out is None:  # step 0, this rank's own shard: every row
                out, lse = block_out.float(), block_lse
            else:
                _merge(out, lse, block_out, block_lse, rows)
        if not last:
            _wait(works)
            kv = next_kv
    return out.to(q.dtype), lse


def _ring_backward(dout: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   opts: AttnOptions, ring: _Ring, layout: str):
    """(dq, dk, dv). The global out and lse make each block's gradients exact; the fp32 gradient of a K/V
    shard travels around the ring with it, each rank adding its part, and one more hop takes it home."""
    seqlen = q.shape[1]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    incoming = None  # (buffer, works): the gradient of the shard held next, on its way from the previous rank
    for step in range(ring.world):
        last = step == ring.world - 1
        if not last:
            next_kv, kv_works = ring.pass_on(kv)
        block = ring.block(step, opts.causal, layout, seqlen)
        if block is not None:
            rows, keys, causal = block
            grads = ops.backward(dout[:, rows], q[:, rows], kv[0, :, keys], kv[1, :, keys], out[:, rows],
                                 lse[:, :, rows].contiguous(), _block_opts(opts, rows, keys, causal))
        if incoming is None:
            dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
        else:  # the previous ranks' part of this shard's gradient, sent during the attention above
            dkv, dkv_works = incoming
            _wait(dkv_works)
        if block is not None:
            dq[:, rows] += grads[0]
            dkv[0, :, keys] += grads[1]
            dkv[1, :, keys] += grads[2]
        incoming = ring.pass_on(dkv)  # after the last step this takes each shard's gradient to its owner
        if not last:
            _wait(kv_works)
            kv = next_kv
    dkv, dkv_works = incoming
    _wait(dkv_works)
    return dq.to(q.dtype), dkv[0].to(kv.dtype), dkv[1].to(kv.dtype)


class _RingFlashAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opts, ring, layout):
        kv = torch.stack([k, v])  # one buffer: one message per hop
        out, lse = _ring_forward(q, kv, opts, ring, layout)
        ctx.save_for_backward(q, kv, out, lse)
        ctx.opts, ctx.ring, ctx.layout = opts, ring, layout
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:  # out took no part in what was differentiated
            return None, None, None, None, None, None
        q, kv, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout, q, kv, out, lse, ctx.opts, ctx.ring, ctx.layout)
        return dq, dk, dv, None, None, None


def ring_flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    layout: str = "zigzag",
):
    """Attention over a sequence sharded across the ranks of `group`, by ring attention: the K/V shards
    travel around the ring (rank r sends to r+1), each rank attending its queries to the shard it holds
    while the next one arrives, and the partial results merge by their log-sum-exp (in fp32). The
    backward sends the K/V shards around again, with their gradients. Memory per rank is that of its
    shard plus one K/V shard in flight.

    Causal attention is over the global positions. With layout="zigzag" every rank does the same work
    under a causal mask; with "contiguous" rank r does r + 1 blocks' worth. Supports MQA/GQA and softcap;
    not window_size or alibi_slopes (NotImplementedError: ulysses_flash_attn_func supports them).
    Every rank must call it with the same arguments; the shapes, dtypes and devices of the shards are
    compared across the ranks first (a host-side collective, see the module's docstring).

    Arguments:
        q: (batch_size, seqlen / W, nheads, headdim), this rank's shard (shard_sequence).
        k: (batch_size, seqlen / W, nheads_k, headdim), this rank's shard.
        v: (batch_size, seqlen / W, nheads_k, headdim), this rank's shard.
        group: the process group (None: the default group); W is its size.
        layout: "zigzag" (the default; the local length must then be even) or "contiguous".
        Other arguments are those of flash_attn_func.
    Return:
        out: (batch_size, seqlen / W, nheads, headdim), this rank's shard of the output.
        softmax_lse [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen / W), fp32, the
            logsumexp of this rank's query rows over the whole sequence. The third value is None.
    """
    check_layout(layout)
    check_ring_features(window_size, alibi_slopes)
    _check_shards("ring_flash_attn_func", group, layout, q, k, v)
    if dist.get_world_size(group) == 1:
        return flash_attn_func(q, k, v, 0.0, softmax_scale, causal, softcap=softcap, deterministic=deterministic,
                               return_attn_probs=return_attn_probs)
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    opts = attn_options(q, None, None, q.shape[1], k.shape[1], 0.0, softmax_scale, causal, (-1, -1), softcap, None,
                        deterministic)
    out, lse = _RingFlashAttn.apply(q, k, v, opts, _Ring(group), layout)
    return (out, lse, None) if return_attn_probs else out


def ring_flash_attn_varlen_func(*args, **kwargs):
    """Not implemented: packed variable-length sequences (cu_seqlens) in a ring would need each sequence
    sharded over the ranks on its own. Raises NotImplementedError."""
    raise NotImplementedError("ring_flash_attn_varlen_func is not implemented: the ring takes dense "
                              "(batch, seqlen / W, nheads, headdim) shards (ring_flash_attn_func)")


# ----------------------------------------------------------------------------------------------
# Ulysses (all-to-all) attention


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Part j of dim 0 goes to rank j, and part j of the result came from rank j; the gradient goes back
    by the same exchange."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.group), None


def _seq_to_heads(x: torch.Tensor, group, world: int, layout: str) -> torch.Tensor:
    """(batch, seqlen / W, heads, dim) sequence shard -> (batch, seqlen, heads / W, dim) head shard."""
    batch, seqlen, heads, dim = x.shape
    parts = x.reshape(batch, seqlen, world, heads // world, dim).permute(2, 0, 1, 3, 4)  # part j: rank j's heads
    gathered = _AllToAll.apply(parts, group)  # part j: rank j's sequence shard of our heads
    whole = gathered.permute(1, 0, 2, 3, 4).reshape(batch, world * seqlen, heads // world, dim)
    return _to_natural(whole, 1, world, layout)


def _heads_to_seq(x: torch.Tensor, group, world: int, layout: str) -> torch.Tensor:
    """The inverse of _seq_to_heads."""
    batch, seqlen, heads, dim = x.shape
    parts = _from_natural(x, 1, world, layout).reshape(batch, world, seqlen // world, heads, dim)
    gathered = _AllToAll.apply(parts.transpose(0, 1), group)  # part j: rank j's heads of our shard
    return gathered.permute(1, 2, 0, 3, 4).reshape(batch, seqlen // world, world * heads, dim)


def ulysses_flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    layout: str = "zigzag",
):
    """Attention over a sequence sharded across the ranks of `group`, by all-to-all (DeepSpeed-Ulysses):
    q, k and v go from sequence shards to head shards (the whole sequence, nheads / W heads), each rank
    runs flash_attn_func on its heads, and the output comes back to sequence shards. Four all-to-alls
    each way (q, k, v, out), each of a rank's whole shard.

    Every feature of flash_attn_func but dropout: causal, window_size, softcap, alibi_slopes (of all the
    heads; each rank uses its heads' slopes), MQA/GQA. nheads must be divisible by W, and nheads_k too,
    or else W by nheads_k (each rank then gets a copy of the one kv head its query heads read); otherwise
    ValueError (ring_flash_attn_func takes any head count). Every rank must call it with the same
    arguments; the shapes, dtypes and devices of the shards are compared across the ranks first.

    Arguments:
        q: (batch_size, seqlen / W, nheads, headdim), this rank's shard (shard_sequence).
        k: (batch_size, seqlen / W, nheads_k, headdim), this rank's shard.
        v: (batch_size, seqlen / W, nheads_k, headdim), this rank's shard.
        group: the process group (None: the default group); W is its size.
        layout: "zigzag" (the default; the local length must then be even) or "contiguous".
        Other arguments are those of flash_attn_func, over global positions.
    Return:
        out: (batch_size, seqlen / W, nheads, headdim), this rank's shard of the output.
        softmax_lse [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen / W), fp32. The
            third value is None.
    """
    check_layout(layout)
    _check_shards("ulysses_flash_attn_func", group, layout, q, k, v)
    world = dist.get_world_size(group)
    if world == 1:
        return flash_attn_func(q, k, v, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes,
                               deterministic, return_attn_probs)
    nheads, nheads_k = q.shape[2], k.shape[2]
    check_ulysses_heads(nheads, nheads_k, world)
    # the options against all the heads, before the slopes are cut to this rank's
    attn_options(q, None, None, 0, 0, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic)
    if nheads_k < world:  # autograd sums the copies' gradients
        k, v = k.repeat_interleave(world // nheads_k, dim=2), v.repeat_interleave(world // nheads_k, dim=2)
    if alibi_slopes is not None:
        share = nheads // world
        rank = dist.get_rank(group)
        alibi_slopes = alibi_slopes[..., rank * share:(rank + 1) * share]
    q, k, v = (_seq_to_heads(x, group, world, layout) for x in (q, k, v))
    result = flash_attn_func(q, k, v, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                             return_attn_probs)
    if not return_attn_probs:
        return _heads_to_seq(result, group, world, layout)
    out, lse, _ = result
    # lse (batch, heads / W, seqlen) takes the same road as a (batch, seqlen, heads / W, 1) tensor
    lse = _heads_to_seq(lse.transpose(1, 2).unsqueeze(-1), group, world, layout)
    return _heads_to_seq(out, group, world, layout), lse[..., 0].transpose(1, 2).contiguous(), None


__all__ = [
    "LAYOUTS",
    "rank_chunks",
    "ring_block",
    "ring_flash_attn_func",
    "ring_flash_attn_varlen_func",
    "shard_sequence",
    "ulysses_flash_attn_func",
    "unshard_sequence",
]
