"""Which kernels run a call: the one seam between the portable Triton kernels and the Hopper Gluon
kernels (FlashAttention-4's `can_implement` pattern).

- "triton": the portable kernels (portable/forward.py, portable/backward.py), every GPU and every option.
- "gluon-sm90": sm90/forward.py on sm_90 GPUs (flex_attention's forward too, through sm90/flex.py), for
  fp16/bf16, head dims 64/128/256 (and MLA's 192 with value head dim 128), without dropout; causal, windows,
  GQA/MQA, softcap, ALiBi and packed variable-length batches included; and for e4m3 (FP8) dense batches. For the
  backward, sm90/backward.py computes dK, dV and, in the same kernel, dQ (head dims 64, 128 and 256, and MLA's 192
  with value head dim 128; the same options); deterministic calls take dQ from the Triton dQ kernel.

FLASHATTN2_BACKEND (read at import; set_backend() changes it) picks: "auto" (the default: Gluon
where it can run the call and was measured faster: the forward at head dims 128/256 without softcap and at 64
for dense calls from 512 query rows (1024 causal), MLA's 192/128, FP8 at head dims 64/128/256 without softcap
but causal calls under 16k query rows at 64 and 1k at 128/256, the backward at head dims 64, 128 and 256 and
MLA's 192/128 but deterministic calls below 256 and causal calls under 1024 query rows at 64 and 128, and
flash_attn_with_kvcache over MLA's latent cache), "gluon" (Gluon wherever it can run the call) or "triton"
(never Gluon: the way out for a user who hits a problem
in the Gluon kernels). Calls that Gluon cannot run always take
the Triton kernels; forward_backend() says which a call takes and why. Both forwards write the same
outputs and LSE (natural log, +inf for rows with no key), so either backward can follow either.

This module makes the package's forward and backward plans (forward_plan, backward_plan) and keeps them: the
choice is made once per shape and option set. It imports the kernel modules; they do not import it.
"""

import os

import torch

from .launch import PlanCache
from .params import AttnOptions
from .portable import backward, forward
from .sm90.gluon_api import AVAILABLE as GLUON_AVAILABLE

CHOICES = ("auto", "gluon", "triton")


def _checked(name: str) -> str:
    if name not in CHOICES:
        raise ValueError(f"FLASHATTN2_BACKEND must be one of {CHOICES}, got {name!r}")
    return name


_choice = _checked(os.environ.get("FLASHATTN2_BACKEND", "auto"))
_sm90 = None
_bwd_sm90 = None
# the package's plans of either backend, by forward.plan_key and backward.plan_key: the choice is made once per
# shape and option set, and set_backend() drops them (the portable modules' own caches hold Triton plans only)
_plans = PlanCache()
_bwd_plans = PlanCache()
_caches: list[dict] = [_plans, _bwd_plans]


def _gluon_forward():
    # imported on first use: the Gluon module compiles nothing at import, but it needs Gluon itself
    global _sm90
    if _sm90 is None:
        from .sm90 import forward as fwd_sm90

        _sm90 = fwd_sm90
    return _sm90


def set_backend(name: str) -> None:
    """Switch the backend for the calls that follow (plans made before are dropped)."""
    global _choice
    _choice = _checked(name)
    for cache in _caches:
        cache.clear()


def get_backend() -> str:
    return _choice


def _decide(sm90, reason: str | None, q: torch.Tensor, opts: AttnOptions) -> tuple[str, str | None]:
    """(backend, why not Gluon) from what the Gluon module (sm90.forward or sm90.backward) said of the call, with
    "auto" also asking where it was measured faster."""
    if reason is None and _choice == "auto":
        reason = sm90.auto_declines(q, opts)
    return ("triton", reason) if reason else ("gluon-sm90", None)


def _gluon_off() -> str | None:
    if _choice == "triton":
        return "FLASHATTN2_BACKEND=triton"
    if not GLUON_AVAILABLE:
        return "this Triton has no Gluon"
    return None


def forward_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions,
                    return_probs: bool = False) -> tuple[str, str | None]:
    """(backend, why not Gluon or None) for a forward call."""
    off = _gluon_off()
    if off:
        return "triton", off
    sm90 = _gluon_forward()
    return _decide(sm90, sm90.can_implement(q, k, v, opts, return_probs), q, opts)


def forward_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions, return_probs: bool = False,
                 config=None):
    """The forward plan of the backend this call takes (a Triton config pins the Triton kernels)."""
    key = forward.plan_key(q, k, v, opts, return_probs, config)
    plan = _plans.get(key)
    if plan is None:
        if config is None and forward_backend(q, k, v, opts, return_probs)[0] == "gluon-sm90":
            plan = _sm90.Sm90ForwardPlan(q, k, v, opts)
        else:
            plan = forward.ForwardPlan(q, k, v, opts, return_probs, config)
        _plans.add(key, plan)
    return plan


def _gluon_backward():
    global _bwd_sm90
    if _bwd_sm90 is None:
        from .sm90 import backward as bwd_sm90

        _bwd_sm90 = bwd_sm90
    return _bwd_sm90


def backward_backend(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     opts: AttnOptions) -> tuple[str, str | None]:
    """(backend of the backward, why not Gluon or None). On Gluon, deterministic calls take their dQ from
    the Triton dQ kernel."""
    off = _gluon_off()
    if off:
        return "triton", off
    sm90 = _gluon_backward()
    return _decide(sm90, sm90.can_implement(dout, q, k, v, opts), q, opts)


def backward_sm90(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
                  opts: AttnOptions):
    """The Gluon launch for this backward call, or None where the Triton kernels run it."""
    if backward_backend(dout, q, k, v, opts)[0] != "gluon-sm90":
        return None
    return _bwd_sm90.Sm90Backward(dout, q, k, v, lse, opts)


def backward_plan(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, opts: AttnOptions) -> backward.BackwardPlan:
    """The backward plan of this call: the Triton kernels, with the Gluon launch where this call takes it."""
    key = backward.plan_key(dout, q, k, v, out, lse, opts, None)
    plan = _bwd_plans.get(key)
    if plan is None:
        plan = _bwd_plans.add(key, backward.BackwardPlan(dout, q, k, v, out, lse, opts, None,
                                                         lambda: backward_sm90(dout, q, k, v, lse, opts)))
    return plan


def _flex_backend(half: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask) -> tuple[str, str | None]:
    off = _gluon_off()
    if off:
        return "triton", off
    from .sm90 import flex as flex_sm90

    can = flex_sm90.can_implement if half == "forward" else flex_sm90.can_implement_backward
    reason = can(q, k, v, block_mask)
    return ("triton", reason) if reason else ("gluon-sm90", None)


def flex_forward_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask) -> tuple[str, str | None]:
    """(backend, why not Gluon or None) for a flex_attention forward ((batch, heads, seqlen, head_dim) inputs)."""
    return _flex_backend("forward", q, k, v, block_mask)


def flex_backward_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask) -> tuple[str, str | None]:
    """(backend, why not Gluon or None) for a flex_attention backward."""
    return _flex_backend("backward", q, k, v, block_mask)


def _flex_module(gluon: bool):
    # imported on first use, as the dense Gluon modules are
    if gluon:
        from .sm90 import flex as module
    else:
        from .portable import flex as module
    return module


def flex_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, scale: float, bits, mod=None):
    """(out, lse) of a flex_attention forward on the backend flex_forward_backend picks (mod: a
    score_mod.CompiledMod or None)."""
    if flex_forward_backend(q, k, v, block_mask)[0] == "gluon-sm90":
        return _flex_module(True).flex_forward(q, k, v, block_mask, scale, bits, mod)
    return _flex_module(False).flex_forward(q, k, v, block_mask, scale, bits, mod)


def flex_backward(dout, q, k, v, out, lse, block_mask, scale: float, bits, q_ids, mod=None):
    """(dq, dk, dv) of a flex_attention call on the backend flex_backward_backend picks (mod as flex_forward's)."""
    if flex_backward_backend(q, k, v, block_mask)[0] == "gluon-sm90":
        return _flex_module(True).flex_backward(dout, q, k, v, out, lse, block_mask, scale, bits, q_ids, mod)
    return _flex_module(False).flex_backward(dout, q, k, v, out, lse, block_mask, scale, bits, q_ids, mod)


def kvcache_hopper():
    """flash_attn_with_kvcache's maker of a Gluon attend (sm90/latent.py: MLA's latent cache), for
    portable.kvcache.KVCachePlan, or None. "auto" takes it wherever latent.can_implement does: 1.4-2.5x the Triton
    kernel from batch 8 (H100), 1.1-1.8x at batch 1-4 with 4k-16k keys (H200; benchmarks/NOTES.md, session 32)."""
    if _choice == "triton" or not GLUON_AVAILABLE:
        return None
    from .portable.cu_seqlens import KVCACHE_WORD
    from .sm90 import latent

    def make(q, k_cache, v_cache, k_new, cache_seqlens, cache_leftpad, cache_batch_idx, block_table, opts,
             num_splits, o_strides, l_strides):
        if latent.can_implement(q, k_cache, v_cache, k_new, cache_leftpad, block_table, opts) is not None:
            return None
        return latent.LatentLaunch(q, k_cache, block_table, cache_seqlens, cache_batch_idx, opts, num_splits,
                                   o_strides, l_strides, int(KVCACHE_WORD.value))

    # what decides the plan it makes: KVCachePlan caches by it ("auto" and "gluon" take the same calls)
    make.key = ("sm90-latent", tuple(sorted(latent.LATENT_TUNING.items())))
    return make
