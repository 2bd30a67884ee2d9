"""The attention op behind the public API, with autograd, in two forms that share one implementation.

- Eager calls go through `_FlashAttn`, a torch.autograd.Function that calls the kernels directly.
- Under torch.compile (and other tracing: fake tensors, dispatch modes), the same work runs behind
  two torch.library custom ops, flashattn2::fwd and flashattn2::bwd, which the tracer sees as one
  opaque node each, with fake implementations. Their Python dispatch costs several hundred
  microseconds per call, which is why eager calls do not take that road.

Both forms take the call's options as one AttnOptions; the ops flatten it into their schema and
rebuild it by name (fwd_op_call).
"""

import contextlib
import inspect
from typing import Optional

import torch

from .kernels.backends import backward_plan, forward_plan
from .kernels.launch import align
from .kernels.params import AttnOptions
from .kernels.portable import cu_seqlens
from .kernels.portable.forward import ForwardPlan


def device_guard(x: torch.Tensor):
    """A context that makes x's device current (the kernels launch on the current device), else a no-op."""
    if x.is_cuda and x.get_device() != torch.cuda.current_device():
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions, return_probs: bool = False,
            plan: ForwardPlan | None = None, descales: tuple | None = None):
    """(out, lse, probs or None), no autograd. descales: FP8 inputs' (q, k, v) factors (fp8.py)."""
    plan = plan or forward_plan(q, k, v, opts, return_probs)
    args = (q, k, v, opts) if descales is None else (q, k, v, opts, descales)
    with device_guard(q):
        if not opts.varlen:
            return plan(*args)
        cu_seqlens.raise_pending(q.device)
        out, lse, probs = plan(*args)
        cu_seqlens.check_and_poison(opts.cu_seqlens_q, opts.cu_seqlens_k, q.shape[0], k.shape[0], opts.max_seqlen_q,
                                    opts.max_seqlen_k, (out, lse, probs))
        return out, lse, probs


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, opts: AttnOptions, fwd_plan: ForwardPlan | None = None,
             sink: tuple[torch.Tensor, torch.Tensor] | None = None):
    """(dq, dk, dv). With the forward's plan, the backward's is looked up by the gradient's layout alone.
    sink: (learnable_sink, dsink): the sink's gradient is added into dsink, float32 (BackwardPlan.__call__)."""
    # the kernels need a unit stride on the head dim; upstream ops may hand any layout
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    if fwd_plan is None:
        plan = backward_plan(dout, q, k, v, out, lse, opts)
    else:
        key = (dout.stride(), dout.dtype, align(dout))
        plan = fwd_plan.backward_plans.get(key)
        if plan is None:
            plan = fwd_plan.backward_plans[key] = backward_plan(dout, q, k, v, out, lse, opts)
    with device_guard(q):
        if not opts.varlen:
            return plan(dout, q, k, v, out, lse, opts, sink)
        cu_seqlens.raise_pending(q.device)
        dq, dk, dv = plan(dout, q, k, v, out, lse, opts, sink)
        cu_seqlens.check_and_poison(opts.cu_seqlens_q, opts.cu_seqlens_k, q.shape[0], k.shape[0], opts.max_seqlen_q,
                                    opts.max_seqlen_k, (dq, dk, dv))
        return dq, dk, dv


class _FlashAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opts: AttnOptions, return_probs: bool, plan: ForwardPlan | None):
        plan = plan or forward_plan(q, k, v, opts, return_probs)
        out, lse, probs = forward(q, k, v, opts, return_probs, plan)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts, ctx.plan = opts, plan
        ctx.mark_non_differentiable(lse, *([] if probs is None else [probs]))
        # lse and probs have no gradient: do not have autograd build zeros for them
        ctx.set_materialize_grads(False)
        return out, lse, probs

    @staticmethod
    def backward(ctx, dout, _dlse, _dprobs):
        if dout is None:  # out took no part in what was differentiated
            return None, None, None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward(dout, q, k, v, out, lse, ctx.opts, ctx.plan)
        return dq, dk, dv, None, None, None


def is_traced(q: torch.Tensor) -> bool:
    """True where the custom ops must stand in: torch.compile, fake or wrapped tensors, dispatch modes."""
    return (torch.compiler.is_compiling() or type(q) is not torch.Tensor
            or torch._C._len_torch_dispatch_stack() > 0)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions, return_probs: bool = False,
              plan: ForwardPlan | None = None):
    """(out, lse, probs or None) with autograd through out; lse and probs carry no gradient. `plan` is
    forward_plan's for these inputs, where the caller has it already."""
    if is_traced(q):
        out, lse, probs = torch.ops.flashattn2.fwd(q, k, v, *opts.tensors(), *_op_scalars(opts), return_probs)
        return out, lse, probs if return_probs else None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _FlashAttn.apply(q, k, v, opts, return_probs, plan)
    return forward(q, k, v, opts, return_probs, plan)


# ----------------------------------------------------------------------------------------------
# the custom ops, for tracing. Their schema is flat; the tensors come first in TENSOR_FIELDS order.


def fwd_op_call(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng_seed, max_seqlen_q, max_seqlen_k,
                softmax_scale, window_left, window_right, softcap, dropout_p, deterministic, return_probs):
    """The forward op's inputs, by name: (q, k, v, opts, return_probs)."""
    opts = AttnOptions(softmax_scale=softmax_scale, window_left=window_left, window_right=window_right,
                       softcap=softcap, dropout_p=dropout_p, alibi_slopes=alibi_slopes, rng_seed=rng_seed,
                       cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                       max_seqlen_k=max_seqlen_k, deterministic=deterministic)
    return q, k, v, opts, return_probs


_FWD_OP_INPUTS = len(inspect.signature(fwd_op_call).parameters)


def _op_scalars(opts: AttnOptions) -> tuple:
    """The ops' arguments after the tensors, in fwd_op_call's order (less return_probs)."""
    return (opts.max_seqlen_q, opts.max_seqlen_k, opts.softmax_scale, opts.window_left, opts.window_right,
            opts.softcap, opts.dropout_p, opts.deterministic)


@torch.library.custom_op("flashattn2::fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
            cu_seqlens_k: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
            rng_seed: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
            window_left: int, window_right: int, softcap: float, dropout_p: float, deterministic: bool,
            return_probs: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, lse, probs = forward(*fwd_op_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng_seed, max_seqlen_q, max_seqlen_k, softmax_scale,
        window_left, window_right, softcap, dropout_p, deterministic, return_probs))
    return out, lse, probs if probs is not None else q.new_empty(0)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng_seed, max_seqlen_q, max_seqlen_k,
              softmax_scale, window_left, window_right, softcap, dropout_p, deterministic, return_probs):
    if cu_seqlens_q is not None:
        batch, nheads = cu_seqlens_q.shape[0] - 1, q.shape[1]
        lse_shape = (nheads, q.shape[0])
    else:
        batch, max_seqlen_q, nheads, _ = q.shape
        max_seqlen_k = k.shape[1]
        lse_shape = (batch, nheads, max_seqlen_q)
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)  # v's head dim (MLA)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    probs_shape = (batch, nheads, max_seqlen_q, max_seqlen_k) if return_probs else (0,)
    return out, lse, torch.empty(probs_shape, dtype=q.dtype, device=q.device)


@torch.library.custom_op("flashattn2::bwd", mutates_args=())
def _bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
            alibi_slopes: Optional[torch.Tensor], rng_seed: Optional[torch.Tensor], max_seqlen_q: int,
            max_seqlen_k: int, softmax_scale: float, window_left: int, window_right: int, softcap: float,
            dropout_p: float, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, _, _, opts, _ = fwd_op_call(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng_seed, max_seqlen_q,
                                   max_seqlen_k, softmax_scale, window_left, window_right, softcap, dropout_p,
                                   deterministic, False)
    return backward(dout, q, k, v, out, lse, opts)


@_bwd_op.register_fake
def _bwd_fake(dout, q, k, v, out, lse, *args):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))


def _setup_context(ctx, inputs, output):
    q, k, v, opts, _ = fwd_op_call(*inputs)
    out, lse, probs = output
    ctx.save_for_backward(q, k, v, out, lse, *opts.tensors())
    ctx.opts = opts.with_tensors((None,) * len(opts.tensors()))  # the saved ones come back in backward
    ctx.mark_non_differentiable(lse, probs)


def _op_backward(ctx, dout, _dlse, _dprobs):
    q, k, v, out, lse, *tensors = ctx.saved_tensors
    opts = ctx.opts.with_tensors(tensors)
    dq, dk, dv = _bwd_op(dout, q, k, v, out, lse, *opts.tensors(), *_op_scalars(opts))
    # no gradient for the inputs after q, k, v
    return (dq, dk, dv) + (None,) * (_FWD_OP_INPUTS - 3)


_fwd_op.register_autograd(_op_backward, setup_context=_setup_context)


class ForwardOnly(torch.autograd.Function):
    """(out, lse) = forward(*args) for inputs that require grad, where the kernels have no backward yet: the forward
    runs (as flash_attn's does) and a backward through it raises NotImplementedError(why)."""

    @staticmethod
    def forward(ctx, forward, why: str, *args):
        out, lse = forward(*args)
        ctx.why = why
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        raise NotImplementedError(ctx.why)
