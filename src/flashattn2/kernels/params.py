"""The options of one attention call, turned into kernel arguments.

Every option is a compile-time specialisation of the same kernels: a feature that is off compiles
away and costs the plain path nothing.
"""

import math
from typing import NamedTuple

import torch

LOG2E = math.log2(math.e)


class AttnOptions(NamedTuple):
    """Everything about a call but q, k, v: a NamedTuple, because one is built per call and its
    construction is part of the host time of every call."""

    softmax_scale: float
    window_left: int = -1  # < 0: unbounded
    window_right: int = -1  # < 0: unbounded; causal is 0
    softcap: float = 0.0  # 0: off
    dropout_p: float = 0.0
    alibi_slopes: torch.Tensor | None = None  # float32, (nheads,) or (batch, nheads)
    rng_seed: torch.Tensor | None = None  # int64 (1,), drawn from torch's generator when dropout is on
    cu_seqlens_q: torch.Tensor | None = None  # int32 (batch + 1,): packed variable-length sequences
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0  # packed sequences only: the longest one
    max_seqlen_k: int = 0
    deterministic: bool = False  # backward: no atomics, bitwise repeatable
    # (nheads,) attention sinks the forward kernels fold in (sinks.py); eager forward calls only: the custom ops
    # and the backward take the calls without it
    learnable_sink: torch.Tensor | None = None

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def causal(self) -> bool:
        return self.window_right == 0 and self.window_left < 0

    def tensors(self) -> tuple:
        """The optional tensors in TENSOR_FIELDS order: the order in which the kernels take them right
        after their own tensors, and in which the custom ops' schema lists them."""
        return self.cu_seqlens_q, self.cu_seqlens_k, self.alibi_slopes, self.rng_seed

    def with_tensors(self, tensors) -> "AttnOptions":
        return self._replace(**dict(zip(TENSOR_FIELDS, tensors, strict=True)))

    def plan_key(self) -> tuple:
        """Everything about the options that a launch plan depends on: the values, and of the optional
        tensors what Triton specialises on (presence, dtype, layout, pointer alignment)."""
        alibi, cu_q, seed, sink = self.alibi_slopes, self.cu_seqlens_q, self.rng_seed, self.learnable_sink
        return (self.softmax_scale, self.window_left, self.window_right, self.softcap, self.dropout_p,
                self.max_seqlen_q, self.max_seqlen_k, self.deterministic,
                None if sink is None else (sink.dtype, sink.data_ptr() & 15),
                None if alibi is None else (alibi.dtype, alibi.shape, alibi.stride(), alibi.data_ptr() & 15),
                None if cu_q is None else (cu_q.dtype, cu_q.shape, cu_q.data_ptr() & 15,
                                           self.cu_seqlens_k.dtype, self.cu_seqlens_k.data_ptr() & 15),
                None if seed is None else (seed.dtype, seed.data_ptr() & 15))

    def kernel_args(self) -> dict:
        """The arguments the forward and backward kernels share besides their tensors and pointers():
        runtime values and constexpr flags, by name."""
        has_softcap, has_alibi = self.softcap > 0.0, self.alibi_slopes is not None
        alibi = self.alibi_slopes
        return dict(
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


TENSOR_FIELDS = ("cu_seqlens_q", "cu_seqlens_k", "alibi_slopes", "rng_seed")
# the names kernel_args() gives: a kernel that lacks one (no dropout, say) is launched without it (launch.Launch)
OPTION_ARGS = frozenset(AttnOptions(softmax_scale=1.0).kernel_args())


def problem_dims(q: torch.Tensor, k: torch.Tensor, opts: AttnOptions):
    """(batch, max seqlen_q, max seqlen_k, nheads, nheads_k, head_dim) for dense or packed inputs."""
    if opts.varlen:
        return (opts.cu_seqlens_q.shape[0] - 1, opts.max_seqlen_q, opts.max_seqlen_k, q.shape[1], k.shape[1],
                q.shape[2])
    return (q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3])


def row_strides(x: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, row, head) strides; a packed (total, heads, dim) tensor has no batch stride."""
    strides = x.stride()
    if varlen:
        return 0, strides[0], strides[1]
    return strides[0], strides[1], strides[2]


def lse_strides(lse: torch.Tensor, varlen: bool) -> tuple[int, int]:
    """(batch, head) strides of a (batch, heads, seqlen_q) or packed (heads, total_q) row statistic."""
    strides = lse.stride()
    if varlen:
        return 0, strides[0]
    return strides[0], strides[1]
