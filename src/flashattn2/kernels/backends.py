"""Which kernels run a call: the one seam between the portable Triton kernels and the Hopper Gluon
kernels (FlashAttention-4's `can_implement` pattern).

- "triton": the portable kernels (forward.py, backward.py), every GPU and every option.
- "gluon-sm90": fwd_sm90.py on sm_90 GPUs, for fp16/bf16, head dims 64/128/256, without dropout;
  causal, windows, GQA/MQA, softcap, ALiBi and packed variable-length batches included. For the
  backward, bwd_sm90.py computes dK and dV (head dim 128, the same options) and the Triton dQ kernel dQ.

FLASHATTN2_BACKEND (read at import; set_backend() changes it) picks: "auto" (the default: Gluon
where it can run the call and was measured faster: the forward at head dim 128 without softcap; no
backward yet), "gluon" (Gluon
wherever it can run the call) or "triton" (never Gluon: the way out for a user who hits a problem
in the Gluon kernels). Calls that Gluon cannot run always take
the Triton kernels; forward_backend() says which a call takes and why. Both forwards write the same
outputs and LSE (natural log, +inf for rows with no key), so either backward can follow either.
"""

import os

import torch

from . import forward
from .gluon_api import AVAILABLE as GLUON_AVAILABLE
from .params import AttnOptions

CHOICES = ("auto", "gluon", "triton")


def _checked(name: str) -> str:
    if name not in CHOICES:
        raise ValueError(f"FLASHATTN2_BACKEND must be one of {CHOICES}, got {name!r}")
    return name


_choice = _checked(os.environ.get("FLASHATTN2_BACKEND", "auto"))
_sm90 = None
_bwd_sm90 = None
# plan caches that depend on the choice (backward.py adds its own: it imports this module, not the reverse)
_caches: list[dict] = [forward._plans]


def register_cache(cache: dict) -> None:
    _caches.append(cache)


def _gluon_forward():
    # imported on first use: the Gluon module compiles nothing at import, but it needs Gluon itself
    global _sm90
    if _sm90 is None:
        from . import fwd_sm90

        _sm90 = fwd_sm90
    return _sm90


def set_backend(name: str) -> None:
    """Switch the backend for the calls that follow (plans made before are dropped)."""
    global _choice
    _choice = _checked(name)
    for cache in _caches:
        cache.clear()
    if _sm90 is not None:
        _sm90._plans.clear()


def get_backend() -> str:
    return _choice


def forward_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions,
                    return_probs: bool = False) -> tuple[str, str | None]:
    """(backend, why not Gluon or None) for a forward call."""
    if _choice == "triton":
        return "triton", "FLASHATTN2_BACKEND=triton"
    if not GLUON_AVAILABLE:
        return "triton", "this Triton has no Gluon"
    sm90 = _gluon_forward()
    reason = sm90.can_implement(q, k, v, opts, return_probs)
    if reason is None and _choice == "auto":
        reason = sm90.auto_declines(q, opts)
    return ("triton", reason) if reason else ("gluon-sm90", None)


def forward_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions, return_probs: bool = False,
                 config=None):
    """The forward plan of the backend this call takes (a Triton config pins the Triton kernels)."""
    if config is None and forward_backend(q, k, v, opts, return_probs)[0] == "gluon-sm90":
        return _sm90.forward_plan(q, k, v, opts)
    return forward.forward_plan(q, k, v, opts, return_probs, config)


def _gluon_backward():
    global _bwd_sm90
    if _bwd_sm90 is None:
        from . import bwd_sm90

        _bwd_sm90 = bwd_sm90
    return _bwd_sm90


def backward_backend(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     opts: AttnOptions) -> tuple[str, str | None]:
    """(backend of the dK/dV kernel, why not Gluon or None); dQ always comes from the Triton dQ kernel."""
    if _choice == "triton":
        return "triton", "FLASHATTN2_BACKEND=triton"
    if not GLUON_AVAILABLE:
        return "triton", "this Triton has no Gluon"
    sm90 = _gluon_backward()
    reason = sm90.can_implement(dout, q, k, v, opts)
    if reason is None and _choice == "auto":
        reason = sm90.auto_declines(q, opts)
    return ("triton", reason) if reason else ("gluon-sm90", None)


def backward_dkdv(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
                  opts: AttnOptions):
    """The Gluon dK/dV launch for this backward call, or None where the Triton kernel computes them."""
    if backward_backend(dout, q, k, v, opts)[0] != "gluon-sm90":
        return None
    return _bwd_sm90.Sm90DkDv(dout, q, k, v, lse, opts)
