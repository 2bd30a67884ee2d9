"""Attention sinks (gpt-oss; FlashAttention-4's `learnable_sink`): one extra logit per query head in every row's
softmax, with no value, so that a row may put weight on "nothing".

With S the scaled scores of a row and s_h its head's sink, the row's probabilities are exp(S_j - L) and the sink's
exp(s_h - L), where L = logsumexp(S, s_h). Everything follows from the call without a sink, (out0, lse0):

    L = logaddexp(lse0, s_h)          out = out0 * exp(lse0 - L)

(a row that sees no key has lse0 = -inf here: out 0, L = s_h). The forward and KV-cache kernels do this in their
final normalisation (device/softmax.finalize; a split KV-cache call in the merge of its splits); traced calls do it
after the custom op in torch ops (fold). The backward kernels need no change: given out and L they form
P_j = exp(S_j - L) and dS = P (dP - Delta) with Delta = rowsum(dO out), which is the gradient of the call with the
sink, because the sink carries no value. The sink's own gradient is d s_h = -sum over the head's rows of
exp(s_h - L) Delta, from the backward's own Delta in eager calls.

The lse flashattn2 returns with a sink is L: it includes the sink.
"""

import torch

from . import ops
from .kernels.params import AttnOptions


def check_sink(sink: torch.Tensor, q: torch.Tensor, nheads: int, opts: AttnOptions, is_fp8: bool = False) -> None:
    """learnable_sink must be (nheads,), float32 or q's dtype, on q's device; dropout and FP8 inputs are refused.
    Called before any kernel runs (a KV-cache call appends to the cache)."""
    if is_fp8:
        raise NotImplementedError("learnable_sink with float8_e4m3fn inputs is not supported")
    if not isinstance(sink, torch.Tensor):
        raise TypeError(f"learnable_sink must be a tensor of shape ({nheads},), got {type(sink).__name__}")
    if sink.shape != (nheads,):
        raise ValueError(f"learnable_sink must have shape ({nheads},) (one logit per query head), got "
                         f"{tuple(sink.shape)}")
    if sink.dtype not in (torch.float32, q.dtype):
        raise TypeError(f"learnable_sink must be float32 or the inputs' dtype {q.dtype}, got {sink.dtype}")
    if sink.device != q.device:
        raise ValueError(f"learnable_sink is on {sink.device}, the inputs on {q.device}")
    if opts.dropout_p > 0.0:
        raise NotImplementedError("learnable_sink with dropout_p > 0 is not supported")


def _head_view(sink: torch.Tensor, lse: torch.Tensor, varlen: bool) -> torch.Tensor:
    # lse is (batch, heads, seqlen), or (heads, total) for packed sequences
    return sink.float().view(-1, 1) if varlen else sink.float().view(1, -1, 1)


def fold(out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor,
         varlen: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of a call without a sink -> with it, in torch ops (traced calls: eager ones have the kernels
    fold it in): out (batch, seqlen, heads, head_dim) with lse (batch, heads, seqlen), or packed (total, heads,
    head_dim) with (heads, total); lse is +inf for rows that saw no key."""
    lse0 = torch.where(lse == float("inf"), float("-inf"), lse)
    total = torch.logaddexp(lse0, _head_view(sink, lse, varlen))
    factor = torch.exp(lse0 - total)  # (batch, heads, seqlen) or (heads, total)
    factor = factor.transpose(-1, -2).unsqueeze(-1)  # (batch, seqlen, heads, 1) or (total, heads, 1)
    return (out.float() * factor).to(out.dtype), total.contiguous()


def sink_grad(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor,
              varlen: bool) -> torch.Tensor:
    """d sink = -sum over each head's rows of exp(sink - lse) rowsum(dout * out), in sink's dtype, in torch ops
    (traced and deterministic calls: eager ones sum it in the backward's own preprocess)."""
    delta = (dout.float() * out.float()).sum(-1).transpose(-1, -2)  # like lse
    grad = -(torch.exp(_head_view(sink, lse, varlen) - lse) * delta)
    return (grad.sum(-1) if varlen else grad.sum((0, 2))).to(sink.dtype)


def _raw_forward(q, k, v, opts: AttnOptions):
    if ops.is_traced(q):
        out, lse, _ = torch.ops.flashattn2.fwd(q, k, v, *opts.tensors(), *ops._op_scalars(opts), False)
        return out, lse
    out, lse, _ = ops.forward(q, k, v, opts)
    return out, lse


def _raw_backward(dout, q, k, v, out, lse, opts: AttnOptions):
    if ops.is_traced(q):
        return torch.ops.flashattn2.bwd(dout, q, k, v, out, lse, *opts.tensors(), *ops._op_scalars(opts))
    return ops.backward(dout, q, k, v, out, lse, opts)


def _forward(q, k, v, sink, opts: AttnOptions):
    """(out, lse, the forward's plan or None) with the sink: the forward kernels fold it into their own
    normalisation (out rounded once, no second pass) in eager calls; traced calls fold it after the custom op, in
    torch ops."""
    if ops.is_traced(q):
        return *fold(*_raw_forward(q, k, v, opts), sink, opts.varlen), None
    opts = opts._replace(learnable_sink=sink.detach().contiguous())
    plan = ops.forward_plan(q, k, v, opts, False)
    out, lse, _ = ops.forward(q, k, v, opts, plan=plan)
    return out, lse, plan


class _SinkAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, opts: AttnOptions):
        out, lse, plan = _forward(q, k, v, sink, opts)
        ctx.save_for_backward(q, k, v, sink, out, lse)
        ctx.opts, ctx.plan = opts, plan
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, sink, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        # deterministic calls sum dsink in torch ops: the fused sum adds per tile with fp32 atomics
        if ops.is_traced(q) or not ctx.needs_input_grad[3] or ctx.opts.deterministic:
            dq, dk, dv = _raw_backward(dout, q, k, v, out, lse, ctx.opts)
            dsink = sink_grad(dout, out, lse, sink, ctx.opts.varlen) if ctx.needs_input_grad[3] else None
            return dq, dk, dv, dsink, None
        # eager: the backward's preprocess, which reads dout and out for Delta anyway, sums dsink too
        dsink = torch.zeros(sink.shape, dtype=torch.float32, device=sink.device)
        dq, dk, dv = ops.backward(dout, q, k, v, out, lse, ctx.opts, ctx.plan, sink=(sink, dsink))
        return dq, dk, dv, dsink.to(sink.dtype), None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor,
              opts: AttnOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) with the sink, autograd to q, k, v and the sink; lse includes the sink."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, sink)):
        return _SinkAttention.apply(q, k, v, sink, opts)
    return _forward(q, k, v, sink, opts)[:2]
