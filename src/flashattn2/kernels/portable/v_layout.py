"""FP8's V stored keys-last: FP8 tensor cores read the P V matmul's V along the keys (K-major), so the FP8
forwards take V as (batch, heads, head_dim, keys) storage, copied once per call by this kernel (each forward
plan makes its copy: the Triton one in key order, the Gluon one with keys relabelled, see `relabel`).

A torch permute-copy of the 1-byte elements took 160-190 µs for 32 MB on the H100, most of a 1k call's gain
(benchmarks/NOTES.md); this kernel loads (keys, head_dim) tiles along the head dim and stores them transposed
along the keys, in about 30 µs. Keys past the sequence, up to the padded length, are written as zeros.
"""

import torch
import triton
import triton.language as tl

from ..common import cdiv, padded_head_dim
from ..launch import Launch, PlanCache, align

# The Gluon FP8 forward stores P, a wgmma accumulator, to shared memory for the P V matmul. A thread holds the
# key pairs 8j + 2t, 8j + 2t + 1 (t = lane % 4), so in key order it writes 2 bytes at a time. Relabelling the
# keys within each 64, key 8j + 2t + i -> 16t + 2j + i, gives each thread 16 contiguous bytes; V stored with
# the same relabelling keeps P V unchanged.
RELABEL_KEYS = 64


@triton.jit
def v_keys_last_kernel(V, Out, seqlen, keys, stride_vb, stride_vs, stride_vh, stride_vd,
                       HEAD_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, RELABEL: tl.constexpr):
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    off_h = tl.program_id(1).to(tl.int64)
    off_b = tl.program_id(2).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    src = (V + off_b * stride_vb + off_h * stride_vh + offs_k[:, None].to(tl.int64) * stride_vs
           + offs_d[None, :] * stride_vd)
    tile = tl.load(src, mask=(offs_k[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM), other=0)
    if RELABEL:  # row 64g + 8j + 2t + i moves to 64g + 16t + 2j + i (RELABEL_KEYS)
        tile = tl.reshape(tl.permute(tl.reshape(tile, (BLOCK_K // 64, 8, 4, 2, BLOCK_D)), (0, 2, 1, 3, 4)),
                          (BLOCK_K, BLOCK_D))
    nheads = tl.num_programs(1)
    row0 = (off_b * nheads + off_h) * HEAD_DIM  # this (batch, head)'s first channel row of Out
    dst = Out + (row0 + offs_d[:, None]) * keys + offs_k[None, :]
    tl.store(dst, tl.trans(tile), mask=(offs_d[:, None] < HEAD_DIM) & (offs_k[None, :] < keys))


# the copy's launches by everything its kernel specialises on (a plan's V keeps one layout): kernel[grid] binds
# its arguments again on every call (launch.py)
_launches = PlanCache(256)


def v_keys_last(v: torch.Tensor, multiple: int = 16, relabel: bool = False, *, block_k: int = 128,
                num_warps: int = 4) -> torch.Tensor:
    """Dense v (batch, seqlen, heads, head_dim) as a new (batch, heads, head_dim, keys) tensor, or packed v
    (total, heads, head_dim) as (heads, head_dim, keys), keys = the length rounded up to `multiple` (zeros
    past it). relabel: keys relabelled within each 64 (RELABEL_KEYS; `multiple` a multiple of 64). block_k,
    num_warps: the copy's tile of keys and its warps (scripts/sweep_v_copy.py)."""
    if relabel and multiple % RELABEL_KEYS:
        raise ValueError(f"relabelled keys come in groups of {RELABEL_KEYS}: multiple={multiple}")
    dense = v.dim() == 4
    batch, seqlen, heads, head_dim = v.shape if dense else (1, *v.shape)
    out = torch.empty(_storage_shape(v, multiple), dtype=torch.uint8, device=v.device)
    keys = out.shape[-1]
    if out.numel():
        src = v.view(torch.uint8)  # the copy moves bytes; the interpreter has no fp8 loads
        key = (src.shape, src.stride(), src.device, align(src), keys, relabel, block_k, num_warps)
        launch = _launches.get(key)
        if launch is None:
            stride_vb, stride_vs, stride_vh, stride_vd = src.stride() if dense else (0, *src.stride())
            launch = _launches.add(key, Launch(
                v_keys_last_kernel, (cdiv(keys, block_k), heads, batch), (),
                dict(seqlen=seqlen, keys=keys, stride_vb=stride_vb, stride_vs=stride_vs, stride_vh=stride_vh,
                     stride_vd=stride_vd, HEAD_DIM=head_dim, BLOCK_K=block_k, BLOCK_D=padded_head_dim(head_dim),
                     RELABEL=relabel), num_warps, 3))
        launch(src, out)
    out = out.view(v.dtype)
    return out if dense else out[0]


def _storage_shape(v: torch.Tensor, multiple: int) -> tuple[int, int, int, int]:
    batch, seqlen, heads, head_dim = v.shape if v.dim() == 4 else (1, *v.shape)
    return batch, heads, head_dim, cdiv(seqlen, multiple) * multiple


def _as_v(vt: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Keys-last storage vt (batch, heads, head_dim, keys) viewed with v's shape."""
    if v.dim() == 4:
        return vt[..., :v.shape[1]].permute(0, 3, 1, 2)
    return vt[0, ..., :v.shape[0]].permute(2, 0, 1)


def keys_last_layout(v: torch.Tensor, multiple: int = 16) -> torch.Tensor:
    """A meta tensor with the shape and strides of keys_last(v, multiple)."""
    return _as_v(torch.empty(_storage_shape(v, multiple), dtype=v.dtype, device="meta"), v)


def keys_last(v: torch.Tensor, multiple: int = 16) -> torch.Tensor:
    """v with the same shape, stored sequence-contiguous per (batch, head, channel), keys in order: the
    Triton FP8 forward loads such V tiles K-major without a transpose. Each channel's row of keys starts
    16-byte aligned."""
    vt = v_keys_last(v, multiple)  # (batch, heads, head_dim, keys) or (heads, head_dim, total)
    return _as_v(vt if v.dim() == 4 else vt[None], v)
