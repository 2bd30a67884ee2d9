"""Plain-PyTorch attention with flashattn2's semantics, used as the test oracle and as a readable spec.

It materialises the (seqlen_q, seqlen_k) score matrix, so it is for checking, not for speed.
"""

import math

import torch


def causal_mask(seqlen_q: int, seqlen_k: int, device: torch.device | str | None = None) -> torch.Tensor:
    """True where query i must NOT see key j: bottom-right aligned, j > i + seqlen_k - seqlen_q."""
    rows = torch.arange(seqlen_q, device=device)[:, None]
    cols = torch.arange(seqlen_k, device=device)[None, :]
    return cols > rows + (seqlen_k - seqlen_q)


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None,
                  causal: bool = False, upcast: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention on (batch, seqlen, nheads, headdim) tensors; returns (out, lse).

    upcast=True computes in float64 (the oracle) and returns float64; upcast=False computes in the
    input dtype, the way a plain PyTorch model would, to measure how much error that dtype costs.
    GQA: query head h reads kv head h // (nheads // nheads_k). lse is float32-or-wider, shaped
    (batch, nheads, seqlen_q), natural log; rows that see no key give out = 0 and lse = +inf.
    """
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    seqlen_q, nheads, head_dim = q.shape[1], q.shape[2], q.shape[3]
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    k = k.repeat_interleave(nheads // nheads_k, dim=2)
    v = v.repeat_interleave(nheads // nheads_k, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        scores = scores.masked_fill(causal_mask(seqlen_q, seqlen_k, q.device), float("-inf"))
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
    # keep empty rows finite through softmax (and its backward), then zero them
    scores = scores.masked_fill(empty, 0.0)
    probs = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    lse = torch.logsumexp(scores.float() if not upcast else scores, dim=-1)
    lse = lse.masked_fill(empty.squeeze(-1), float("inf"))
    return out, lse


def max_abs_error(x: torch.Tensor, ref: torch.Tensor, where: torch.Tensor | None = None) -> float:
    """max |x - ref| in float64, over the elements selected by `where` (all by default)."""
    diff = (x.double() - ref.double()).abs()
    if where is not None:
        diff = diff[where]
    return diff.max().item() if diff.numel() else 0.0


def within_tolerance(ours: torch.Tensor, ref: torch.Tensor, pt: torch.Tensor, factor: float,
                     floor: float = 1e-5, where: torch.Tensor | None = None) -> tuple[bool, float, float]:
    """flash_attn's pass rule: our max error against the float64 oracle `ref` is at most `factor` times
    the error of `pt`, the same math done by PyTorch in the input dtype, plus a small absolute floor.
    Returns (passed, our error, PyTorch's error); NaN never passes."""
    err, pt_err = max_abs_error(ours, ref, where), max_abs_error(pt, ref, where)
    return err <= factor * pt_err + floor, err, pt_err
