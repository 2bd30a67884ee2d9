"""FP8 attention forward (FlashAttention-3's low-precision path): q, k, v in float8_e4m3fn with per-(batch, kv
head) descale factors, the true value being the fp8 value times its descale; the output is bfloat16.

The kernels are the forwards' IS_FP8 variants (on Hopper the Gluon one, kernels/sm90/forward.py, elsewhere and for what
it declines the Triton one): both matmuls take e4m3 operands (P too, scaled by 2**8 so that small probabilities keep
their precision) and accumulate in fp32; the descales fold into the score scale and the output. FP8 tensor cores read
V along the keys: each call copies V so (kernels/portable/v_layout.py). Forward only.
"""

from typing import Optional

import torch

from .checks import FP8_DTYPE, check_gqa
from .kernels.common import FP8_MIN, gpu_arch
from .kernels.params import AttnOptions
from .ops import forward, fwd_op_call, is_traced

OUT_DTYPE = torch.bfloat16
FP8_MAX = 448.0  # the largest finite e4m3fn value


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, descales: tuple, opts: AttnOptions, plan=None):
    """(out in bf16, lse) of checked FP8 inputs. plan: the call's forward plan, where the caller has it already."""
    if opts.dropout_p > 0.0:
        raise NotImplementedError("dropout with FP8 inputs: FP8 attention is for inference (dropout_p=0)")
    arch = gpu_arch(q)
    if arch is not None and arch < FP8_MIN:
        raise NotImplementedError(f"FP8 attention needs FP8 tensor cores (sm_89 or newer); this GPU is "
                                  f"sm_{''.join(map(str, arch))}")
    if is_traced(q):  # a custom op: dynamo cannot trace the kernel launches
        return torch.ops.flashattn2.fwd_fp8(q, k, v, *descales, opts.cu_seqlens_q, opts.cu_seqlens_k,
                                            opts.alibi_slopes, opts.max_seqlen_q, opts.max_seqlen_k,
                                            opts.softmax_scale, opts.window_left, opts.window_right, opts.softcap)
    out, lse, _ = forward(q, k, v, opts, plan=plan, descales=descales)
    return out, lse


@torch.library.custom_op("flashattn2::fwd_fp8", mutates_args=())
def _fwd_fp8_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: torch.Tensor,
                k_descale: torch.Tensor, v_descale: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                cu_seqlens_k: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor], max_seqlen_q: int,
                max_seqlen_k: int, softmax_scale: float, window_left: int, window_right: int,
                softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, _, opts, _ = fwd_op_call(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, None, max_seqlen_q,
                                   max_seqlen_k, softmax_scale, window_left, window_right, softcap, 0.0, False, False)
    out, lse, _ = forward(q, k, v, opts, descales=(q_descale, k_descale, v_descale))
    return out, lse


@_fwd_fp8_op.register_fake
def _fwd_fp8_fake(q, k, v, q_descale, k_descale, v_descale, cu_seqlens_q, cu_seqlens_k, *args):
    lse_shape = (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], q.shape[2], q.shape[1])
    return (torch.empty(q.shape, dtype=OUT_DTYPE, device=q.device),
            torch.empty(lse_shape, dtype=torch.float32, device=q.device))


def quantize_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantise q, k, v to float8_e4m3fn with one scale per (batch, kv head), for FP8 attention:

        q8, k8, v8, q_descale, k_descale, v_descale = quantize_fp8(q, k, v)
        out = flash_attn_func(q8, k8, v8, causal=True, q_descale=q_descale, k_descale=k_descale,
                              v_descale=v_descale)

    Arguments:
        q: (batch_size, seqlen, nheads, headdim), or (total_q, nheads, headdim) with cu_seqlens_q.
        k, v: (batch_size, seqlen_k, nheads_k, headdim), or (total_k, nheads_k, headdim) with cu_seqlens_k.
        cu_seqlens_q, cu_seqlens_k: (batch_size + 1,) int32, for packed (varlen) inputs.
    Return:
        q8, k8, v8 in float8_e4m3fn, and q_descale, k_descale, v_descale: (batch_size, nheads_k) float32, each
        block's absolute maximum over 448 (e4m3's largest value), so that x ~= x8 * descale. The query heads of
        one kv head share a scale (FlashAttention-3's layout of q_descale).
    """
    nheads_k = k.shape[-2]
    check_gqa(q.shape[-2], nheads_k)
    out = []
    for x, cu in ((q, cu_seqlens_q), (k, cu_seqlens_k), (v, cu_seqlens_k)):
        amax = _block_amax(x, cu, nheads_k)
        descale = torch.clamp(amax, min=1e-12) / FP8_MAX
        scale = (1.0 / descale).repeat_interleave(x.shape[-2] // nheads_k, dim=1)  # per query head
        if cu is None:
            x8 = (x.float() * scale[:, None, :, None]).to(FP8_DTYPE)
        else:
            x8 = (x.float() * scale[_token_batch(cu, x.shape[0])][:, :, None]).to(FP8_DTYPE)
        out.append((x8, descale))
    (q8, qd), (k8, kd), (v8, vd) = out
    return q8, k8, v8, qd, kd, vd


def _token_batch(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """The sequence of each packed row (no host sync)."""
    rows = torch.arange(total, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].to(torch.int64), rows, right=True)


def _block_amax(x: torch.Tensor, cu_seqlens: torch.Tensor | None, nheads_k: int) -> torch.Tensor:
    """max |x| per (batch, kv head) as (batch, nheads_k) float32."""
    if cu_seqlens is None:
        b, s, h, d = x.shape
        return x.detach().abs().float().reshape(b, s, nheads_k, h // nheads_k * d).amax(dim=(1, 3))
    total, h, d = x.shape
    per_row = x.detach().abs().float().reshape(total, nheads_k, h // nheads_k * d).amax(dim=2)
    batch = cu_seqlens.shape[0] - 1
    amax = torch.zeros(batch, nheads_k, dtype=torch.float32, device=x.device)
    index = _token_batch(cu_seqlens, total)[:, None].expand(-1, nheads_k)
    return amax.scatter_reduce(0, index, per_row, reduce="amax")
