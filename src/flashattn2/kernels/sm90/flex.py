"""flex_attention's forward on the Hopper Gluon forward (sm90/forward.py) in its block-sparse mode: each work item
(128 query rows of one head) visits its BlockMask's partial blocks, masked by the mask bits, then its full ones,
with the dense kernel's pipeline (TMA ring, two consumer warpgroups, ping-pong). Items run one program each, the
last query blocks first (they see the most keys under causal-like masks).

Flex's (batch, heads, seqlen, head_dim) tensors are read through (batch, seqlen, heads, head_dim) views, so the
dense kernel's descriptors and stores apply unchanged.
"""

import torch

from .. import common
from ..common import cdiv, l2_section
from ..launch import Launch
from ..portable.flex import block_lists
from .common import WG_M, descriptor, sm90_declines
from .forward import CONFIGS, MAXNREG, attention_fwd_sm90_kernel
from .gluon_api import shared_layout

# the dense kernel's keys that place its items (a flex launch runs one program per item, two consumers)
_GRID_KEYS = ("PERSISTENT", "PERSISTENT_CAUSAL", "L2_SECTIONS", "ITEM_COST")
CONSUMERS = 2
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


def flex_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, scale: float,
                 bits: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """portable.flex.flex_forward's contract on the Gluon forward, for calls can_implement took."""
    batch, nheads, seqlen_q, head_dim = q.shape
    nheads_k, seqlen_k = k.shape[1], k.shape[2]
    out = common.empty(q.shape, q.dtype, q.device)
    lse = common.empty((batch, nheads, seqlen_q), torch.float32, q.device)
    if out.numel() == 0:
        return out, lse.fill_(float("-inf"))
    tuning = dict(CONFIGS[head_dim], CONSUMERS=CONSUMERS)
    l2_share = tuning["L2_SECTIONS"]
    for key in _GRID_KEYS:
        del tuning[key]
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
        total_k=0, qk_scale=scale * 1.4426950408889634, window_left=0, window_right=0, softcap_in2=0.0,
        softcap_out=0.0, section=section, HAS_LEFT=False, HAS_RIGHT=False, IS_VARLEN=False, HAS_SOFTCAP=False,
        HAS_ALIBI=False, REVERSE_M=True, IS_FP8=False, **tuning,
        KvNum=tensors[0], KvIndices=tensors[1], PartialIds=tensors[2], FullNum=tensors[3], FullIndices=tensors[4],
        MaskBits=words if words.numel() else tensors[0], stride_num=strides["stride_num"][:2],
        stride_idx=strides["stride_idx"], SPARSE_Q=sparse_q, SPARSE_KV=sparse_kv)
    # a Launch made per call (the lists are tensors among the named arguments): Triton's own path each time
    attend = Launch(attention_fwd_sm90_kernel, (cdiv(seqlen_q, ITEM_ROWS) * batch * nheads, 1, 1), (), named,
                    num_warps=4, num_stages=1, options=dict(maxnreg=MAXNREG[CONSUMERS]))
    attend(descriptor(qt, q_block, q_layout), descriptor(kt, kv_block, kv_layout), descriptor(vt, kv_block, kv_layout),
           descriptor(ot, q_block, q_layout), out, lse, None, None, None, None, None, None, None)
    return out, lse
