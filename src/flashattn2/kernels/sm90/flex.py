"""flex_attention on the Hopper Gluon kernels in their block-sparse mode. The forward (sm90/forward.py): each work
item (128 query rows of one head) visits its BlockMask's partial blocks, masked by the mask bits, then its full
ones, with the dense kernel's pipeline (TMA ring, two consumer warpgroups, ping-pong); items run one program each,
the last query blocks first (they see the most keys under causal-like masks). The backward (sm90/backward.py):
each key tile of a kv head visits, for each of its query heads, the query blocks of the mask's q view, with dQ
added into an fp32 buffer in the same kernel.

Flex's (batch, heads, seqlen, head_dim) tensors are read through (batch, seqlen, heads, head_dim) views, so the
dense kernel's descriptors and stores apply unchanged.
"""

import torch

from .. import common
from ..common import cdiv, l2_section
from ..launch import Launch
from ..portable.flex import block_lists, row_deltas
from .backward import CONFIGS as BWD_CONFIGS
from .backward import HOST_TUNING_KEYS as BWD_HOST_TUNING_KEYS
from .backward import MAXNREG as BWD_MAXNREG
from .backward import attention_bwd_sm90_kernel, dq_block
from .common import WG_M, descriptor, sm90_declines
from .forward import CONFIGS, HOST_TUNING_KEYS, MAXNREG, attention_fwd_sm90_kernel
from .gluon_api import shared_layout

CONSUMERS = 2
_LOG2E = 1.4426950408889634
# the backward's tiles with a score_mod, where they differ from the dense ones: at head dim 64 the mod's arithmetic
# beside 128-row query tiles spilled 1.5-2 KB (sm_90, triton 3.6), and ALiBi's backward ran at 0.65x Flex; 64-row
# tiles spill 0-24 bytes (benchmarks/NOTES.md)
MOD_BWD_TUNING = {64: dict(BLOCK_M=64, DQ_ROWS=False)}
ITEM_ROWS = CONSUMERS * int(WG_M)


def can_implement(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask) -> str | None:
    """None when the Gluon forward runs this flex_attention call ((batch, heads, seqlen, head_dim) inputs), else
    what keeps it on the portable flex kernel."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    reason = sm90_declines(qt, CONFIGS, "kernel", False, kt, vt)
    if reason:
        return reason
    sparse_q, sparse_kv = block_mask.BLOCK_SIZE
    block_n = CONFIGS[q.shape[-1]]["BLOCK_N"]
    if sparse_q % ITEM_ROWS or sparse_kv % block_n:
        return (f"block_mask.BLOCK_SIZE {block_mask.BLOCK_SIZE}: the Gluon forward takes query blocks of a multiple "
                f"of {ITEM_ROWS} rows and key blocks of a multiple of {block_n}")
    if q.shape[2] % sparse_q or k.shape[2] % sparse_kv:
        return "lengths that are not whole mask blocks"
    return None


def _mod_args(mod, scale: float) -> dict:
    """The Gluon kernels' score_mod arguments (sm90.common.ScoreMod) and their qk_scale: a mod's scores come in
    natural units, so only log2(e) remains to apply."""
    if mod is None:
        return dict(qk_scale=scale * _LOG2E)
    return dict(qk_scale=_LOG2E, MOD_FN=mod.fn, MOD_GRAD=mod.grad, captures=mod.captures)


def flex_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, scale: float,
                 bits: tuple[torch.Tensor, torch.Tensor], mod=None) -> tuple[torch.Tensor, torch.Tensor]:
    """portable.flex.flex_forward's contract on the Gluon forward, for calls can_implement took (mod: a
    score_mod.CompiledMod or None)."""
    batch, nheads, seqlen_q, head_dim = q.shape
    nheads_k, seqlen_k = k.shape[1], k.shape[2]
    out = common.empty(q.shape, q.dtype, q.device)
    lse = common.empty((batch, nheads, seqlen_q), torch.float32, q.device)
    if out.numel() == 0:
        return out, lse.fill_(float("-inf"))
    tuning = dict(CONFIGS[head_dim], CONSUMERS=CONSUMERS)
    l2_share = tuning["L2_SECTIONS"]
    for key in HOST_TUNING_KEYS:  # a flex launch runs one program per item, two consumers, the launch's cap
        tuning.pop(key, None)
    block_n = tuning["BLOCK_N"]
    section = 1
    if l2_share:
        section = l2_section(seqlen_k * head_dim * 2 * q.element_size() * nheads_k // nheads, q.device, l2_share)
    ids, words = bits
    tensors, strides = block_lists(block_mask, "kv", ids, batch, nheads, shared_strides=True)
    assert strides["stride_num"][2] == 1, "the kernel steps the counts by query block with stride 1"
    q_block, kv_block = [1, int(WG_M), 1, head_dim], [1, block_n, 1, head_dim]
    q_layout, kv_layout = shared_layout(q_block, q.dtype), shared_layout(kv_block, q.dtype)
    qt, kt, vt, ot = (x.transpose(1, 2) for x in (q, k, v, out))
    sparse_q, sparse_kv = block_mask.BLOCK_SIZE
    named = dict(
        stride_o=(ot.stride(1), ot.stride(2)), stride_lse=(lse.stride(0), lse.stride(1)), stride_alibi_b=0,
        batch=batch, nheads=nheads, group=nheads // nheads_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k, total_q=0,
        total_k=0, window_left=0, window_right=0, softcap_in2=0.0, softcap_out=0.0, section=section, HAS_LEFT=False,
        HAS_RIGHT=False, IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, REVERSE_M=True, IS_FP8=False, **tuning,
        KvNum=tensors[0], KvIndices=tensors[1], PartialIds=tensors[2], FullNum=tensors[3], FullIndices=tensors[4],
        MaskBits=words if words.numel() else tensors[0], stride_num=strides["stride_num"][:2],
        stride_idx=strides["stride_idx"], SPARSE_Q=sparse_q, SPARSE_KV=sparse_kv, mod_scale=scale,
        **_mod_args(mod, scale))
    # a Launch made per call (the lists are tensors among the named arguments): Triton's own path each time
    attend = Launch(attention_fwd_sm90_kernel, (cdiv(seqlen_q, ITEM_ROWS) * batch * nheads, 1, 1), (), named,
                    num_warps=4, num_stages=1, options=dict(maxnreg=MAXNREG[CONSUMERS]))
    attend(descriptor(qt, q_block, q_layout), descriptor(kt, kv_block, kv_layout), descriptor(vt, kv_block, kv_layout),
           descriptor(ot, q_block, q_layout), out, lse, None, None, None, None, None, None, None, None)
    return out, lse


def can_implement_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask) -> str | None:
    """None when the Gluon backward (sm90/backward.py, block-sparse mode) runs this call's gradients."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    reason = sm90_declines(qt, BWD_CONFIGS, "backward", False, kt, vt)
    if reason:
        return reason
    sparse_q, sparse_kv = block_mask.BLOCK_SIZE
    tuning = BWD_CONFIGS[q.shape[-1]]
    keys = int(WG_M) if tuning["SPLIT_D"] else 2 * int(WG_M)
    if sparse_q % tuning["BLOCK_M"] or sparse_kv % keys:
        return (f"block_mask.BLOCK_SIZE {block_mask.BLOCK_SIZE}: the Gluon backward takes query blocks of a multiple "
                f"of {tuning['BLOCK_M']} rows and key blocks of a multiple of {keys}")
    if q.shape[2] % sparse_q or k.shape[2] % sparse_kv:
        return "lengths that are not whole mask blocks"
    return None


def flex_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, block_mask, scale: float, bits: tuple[torch.Tensor, torch.Tensor],
                  q_ids: torch.Tensor, mod=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """portable.flex.flex_backward's contract on the Gluon backward (dQ summed by bulk reduce-adds into an fp32
    buffer, so not bitwise repeatable), for calls can_implement_backward took."""
    batch, nheads, seqlen_q, head_dim = q.shape
    nheads_k, seqlen_k = k.shape[1], k.shape[2]
    dk = common.empty(k.shape, k.dtype, k.device)
    dv = common.empty(v.shape, v.dtype, v.device)
    if q.numel() == 0 or k.numel() == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    dout = dout if dout.stride(-1) == 1 and dout.data_ptr() % 16 == 0 else dout.contiguous()
    dq_acc = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    delta = row_deltas(out, dout, dq_acc)  # (batch, heads, seqlen_q) like lse; dq_acc zeroed
    tuning = dict(BWD_CONFIGS[head_dim], **(MOD_BWD_TUNING.get(head_dim, {}) if mod is not None else {}))
    for key in BWD_HOST_TUNING_KEYS:  # one program per item, in plain order
        tuning.pop(key, None)
    keys = int(WG_M) if tuning["SPLIT_D"] else 2 * int(WG_M)
    q_block, kv_block = [1, tuning["BLOCK_M"], 1, head_dim], [1, int(WG_M), 1, head_dim]
    dq_blk = dq_block(tuning, head_dim)
    q_layout, kv_layout = shared_layout(q_block, q.dtype), shared_layout(kv_block, q.dtype)
    ids, words = bits
    tensors, strides = block_lists(block_mask, "q", q_ids, batch, nheads, shared_strides=True)
    assert strides["stride_num"][2] == 1, "the kernel steps the counts by key block with stride 1"
    qt, kt, vt, dot, dkt, dvt, dqt = (x.transpose(1, 2) for x in (q, k, v, dout, dk, dv, dq_acc))
    sparse_q, sparse_kv = block_mask.BLOCK_SIZE
    num_tiles = cdiv(seqlen_k, keys) * batch * nheads_k
    named = dict(
        stride_dk=dkt.stride()[:3], stride_dv=dvt.stride()[:3], stride_lse=(lse.stride(0), lse.stride(1)),
        stride_alibi_b=0, nheads=nheads, nheads_k=nheads_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k, total_q=0,
        total_k=0, softmax_scale=scale, window_left=0, window_right=0,
        softcap_in2=0.0, softcap_out=0.0, num_tiles=num_tiles, section=1, HAS_LEFT=False, HAS_RIGHT=False,
        IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, **tuning,
        QNum=tensors[0], QIndices=tensors[1], PartialIds=tensors[2], FullNum=tensors[3], FullIndices=tensors[4],
        MaskBits=words if words.numel() else tensors[0], stride_num=strides["stride_num"][:2],
        stride_idx=strides["stride_idx"], SPARSE_Q=sparse_q, SPARSE_KV=sparse_kv, **_mod_args(mod, scale))
    attend = Launch(attention_bwd_sm90_kernel, (num_tiles, 1, 1), (), named, num_warps=4, num_stages=1,
                    options=dict(maxnreg=BWD_MAXNREG))
    attend(descriptor(qt, q_block, q_layout), descriptor(kt, kv_block, kv_layout),
           descriptor(vt, kv_block, kv_layout), descriptor(dot, q_block, q_layout),
           descriptor(dqt, dq_blk, shared_layout(dq_blk, torch.float32)), lse, delta, dk, dv, None, None, None)
    return dq_acc.to(q.dtype), dk, dv
