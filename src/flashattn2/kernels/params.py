"""The options of one attention call, turned into kernel arguments.

Every option is a compile-time specialisation of the same kernels: a feature that is off compiles
away and costs the plain path nothing.
"""

import math
from dataclasses import dataclass

import torch

LOG2E = math.log2(math.e)


@dataclass(frozen=True)
class AttnOptions:
    softmax_scale: float
    window_left: int = -1  # < 0: unbounded
    window_right: int = -1  # < 0: unbounded; causal is 0
    softcap: float = 0.0  # 0: off
    dropout_p: float = 0.0
    alibi_slopes: torch.Tensor | None = None  # float32, (nheads,) or (batch, nheads)
    rng_seed: torch.Tensor | None = None  # int64 (1,), drawn from torch's generator when dropout is on
    cu_seqlens_q: torch.Tensor | None = None  # int32 (batch + 1,): packed variable-length sequences
    cu_seqlens_k: torch.Tensor | None = None

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    def kernel_args(self) -> tuple[tuple, dict]:
        """The arguments shared by the forward and backward kernels: the optional pointers (cumulative
        lengths, ALiBi slopes, dropout seed; None when unused), which the kernels take in that order right
        after their tensors, and everything else (runtime values and constexpr flags) by name."""
        has_softcap, has_alibi = self.softcap > 0.0, self.alibi_slopes is not None
        alibi = self.alibi_slopes
        pointers = (self.cu_seqlens_q, self.cu_seqlens_k, alibi, self.rng_seed)
        return pointers, dict(
            stride_alibi_b=alibi.stride(0) if has_alibi and alibi.dim() == 2 else 0,
            qk_scale=self.softmax_scale * LOG2E,
            window_left=max(self.window_left, 0), window_right=max(self.window_right, 0),
            # tanh(x) = 1 - 2 / (exp2(2 log2(e) x) + 1) with x = scale * qk / softcap
            softcap_in2=2.0 * LOG2E * self.softmax_scale / self.softcap if has_softcap else 0.0,
            softcap_out=self.softcap * LOG2E,
            dropout_p=self.dropout_p,
            HAS_LEFT=self.window_left >= 0, HAS_RIGHT=self.window_right >= 0, IS_VARLEN=self.varlen,
            HAS_SOFTCAP=has_softcap, HAS_ALIBI=has_alibi, HAS_DROPOUT=self.dropout_p > 0.0,
        )

def problem_dims(q: torch.Tensor, k: torch.Tensor, opts: AttnOptions, max_seqlen_q: int, max_seqlen_k: int):
    """(batch, max seqlen_q, max seqlen_k, nheads, nheads_k, head_dim) for dense or packed inputs."""
    if opts.varlen:
        return (opts.cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k, q.shape[1], k.shape[1], q.shape[2])
    return (q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3])


def row_strides(x: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, row, head) strides; a packed (total, heads, dim) tensor has no batch stride."""
    if varlen:
        return 0, x.stride(0), x.stride(1)
    return x.stride(0), x.stride(1), x.stride(2)


def lse_strides(lse: torch.Tensor, varlen: bool) -> tuple[int, int]:
    """(batch, head) strides of a (batch, heads, seqlen_q) or packed (heads, total_q) row statistic."""
    if varlen:
        return 0, lse.stride(0)
    return lse.stride(0), lse.stride(1)
