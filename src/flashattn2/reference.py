"""Plain-PyTorch attention with flashattn2's semantics, used as the test oracle and as a readable spec.

It materialises the (seqlen_q, seqlen_k) score matrix, so it is for checking, not for speed.
"""

import math

import torch


def causal_mask(seqlen_q: int, seqlen_k: int, device: torch.device | str | None = None) -> torch.Tensor:
    """True where query i must NOT see key j: bottom-right aligned, j > i + seqlen_k - seqlen_q."""
    return window_mask(seqlen_q, seqlen_k, (-1, 0), device)


def window_mask(seqlen_q: int, seqlen_k: int, window_size: tuple[int, int],
                device: torch.device | str | None = None) -> torch.Tensor:
    """True where query i must NOT see key j: outside
    [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]; a negative side is unbounded."""
    left, right = window_size
    diag = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device)[None, :]
    hidden = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        hidden |= cols > diag + right
    if left >= 0:
        hidden |= cols < diag - left
    return hidden


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None = None,
                  causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                  alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0,
                  dropout_mask: torch.Tensor | None = None, upcast: bool = True,
                  learnable_sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention on (batch, seqlen, nheads, headdim) tensors; returns (out, lse).

    upcast=True computes in float64 (the oracle) and returns float64; upcast=False computes in the
    input dtype, the way a plain PyTorch model would, to measure how much error that dtype costs.
    GQA: query head h reads kv head h // (nheads // nheads_k). Scores are scale * q.k, then
    softcap * tanh(scores / softcap), then minus alibi_slope * |i + seqlen_k - seqlen_q - j|, then the
    window (causal = right edge 0) masks them. dropout_mask (batch, nheads, seqlen_q, seqlen_k), True
    where kept, applies dropout with probability dropout_p to the probabilities that reach v; lse is that
    of the scores, without dropout, shaped (batch, nheads, seqlen_q), natural log. Rows that see no key
    give out = 0 and lse = +inf. learnable_sink (nheads,): one more logit per head in every row's softmax,
    with no value (an attention sink); lse then includes it, and no row is empty.
    """
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    nheads, head_dim, nheads_k = q.shape[2], q.shape[3], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    k = k.repeat_interleave(nheads // nheads_k, dim=2)
    v = v.repeat_interleave(nheads // nheads_k, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    probs, lse = _softmax(scores, causal, window_size, softcap, alibi_slopes, learnable_sink)
    if dropout_mask is not None:
        probs = probs.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    return out, lse


def _softmax(scores: torch.Tensor, causal: bool, window_size: tuple[int, int], softcap: float,
             alibi_slopes: torch.Tensor | None, sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled scores (batch, nheads, seqlen_q, seqlen_k) -> (probabilities, lse) in attention_ref's order:
    softcap, ALiBi, window mask, softmax in the scores' dtype; lse in at least fp32, +inf on empty rows. A sink
    (nheads,) is one more column of every row's softmax, dropped from the probabilities."""
    nheads, seqlen_q, seqlen_k = scores.shape[1:]
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(scores.dtype).reshape(-1 if alibi_slopes.dim() == 2 else 1, nheads, 1, 1)
        rows = torch.arange(seqlen_q, device=scores.device)[:, None] + (seqlen_k - seqlen_q)
        dist = (rows - torch.arange(seqlen_k, device=scores.device)[None, :]).abs()
        scores = scores - slopes * dist.to(scores.dtype)
    left, right = window_size
    if causal:
        right = 0
    if left >= 0 or right >= 0:
        scores = scores.masked_fill(window_mask(seqlen_q, seqlen_k, (left, right), scores.device), float("-inf"))
    if sink is not None:
        column = sink.to(scores.dtype).view(1, nheads, 1, 1).expand(*scores.shape[:3], 1)
        full = torch.cat([scores, column], dim=-1)
        lse = torch.logsumexp(full if full.dtype == torch.float64 else full.float(), dim=-1)
        return torch.softmax(full, dim=-1)[..., :-1], lse
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
    # keep empty rows finite through softmax (and its backward), then zero them
    scores = scores.masked_fill(empty, 0.0)
    probs = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
    lse = torch.logsumexp(scores if scores.dtype == torch.float64 else scores.float(), dim=-1)
    return probs, lse.masked_fill(empty.squeeze(-1), float("inf"))


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


def attention_fp8_ref(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, q_descale: torch.Tensor,
                      k_descale: torch.Tensor, v_descale: torch.Tensor, softmax_scale: float | None = None,
                      causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                      alibi_slopes: torch.Tensor | None = None, upcast: bool = True,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 attention's references on float8_e4m3fn (batch, seqlen, nheads, headdim) inputs with (batch, nheads_k)
    descales (true value = fp8 value x descale); returns (out, lse).

    upcast=True: attention_ref in float64 on the dequantised inputs (the oracle). upcast=False: PyTorch doing the
    same math with FP8 matmuls, the baseline of the pass rule: S = q8 k8^T with exact e4m3 products summed in fp32
    (torch._scaled_mm's math) times the descales and the softmax scale, rounded to bf16; softcap, ALiBi, mask and
    softmax in bf16 as attention_ref(upcast=False) does; P x 2**8 rounded to e4m3 (a static scale that keeps small
    probabilities, as FlashAttention-3 does), P8 v8 summed in fp32, then x 2**-8 x v_descale, rounded to bf16.
    """
    group = q8.shape[2] // k8.shape[2]
    qd = q_descale.repeat_interleave(group, dim=1)[:, None, :, None]
    kd, vd = (d[:, None, :, None] for d in (k_descale, v_descale))
    if upcast:
        return attention_ref(q8.double() * qd.double(), k8.double() * kd.double(), v8.double() * vd.double(),
                             softmax_scale, causal, window_size, softcap, alibi_slopes)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q8.shape[-1])
    k = k8.float().repeat_interleave(group, dim=2)
    v = v8.float().repeat_interleave(group, dim=2)
    kd_h = k_descale.repeat_interleave(group, dim=1)[:, :, None, None]
    scores = torch.einsum("bqhd,bkhd->bhqk", q8.float(), k) * (scale * qd.squeeze(-1).transpose(1, 2)[..., None]
                                                                 * kd_h)
    probs, lse = _softmax(scores.to(torch.bfloat16), causal, window_size, softcap, alibi_slopes)
    p8 = (probs.float() * 256.0).to(torch.float8_e4m3fn)
    vd_h = v_descale.repeat_interleave(group, dim=1)[:, None, :, None]
    out = torch.einsum("bhqk,bkhd->bqhd", p8.float(), v) * (vd_h / 256.0)
    return out.to(torch.bfloat16), lse


def flex_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                       scale: float | None = None, upcast: bool = True,
                       score_mod=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention on FlexAttention's (batch, heads, seqlen, head_dim) tensors under a dense mask (batch or 1,
    heads or 1, seqlen_q, seqlen_k), True where a query sees a key, with score_mod(score, b, h, q_idx, kv_idx)
    applied to every scaled score first; returns (out, lse), lse natural log. Rows that see no key give out 0 and
    lse -inf, as FlexAttention does. upcast as in attention_ref."""
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-1, -2)) * scale
    if score_mod is not None:
        fn = score_mod
        for dim in (3, 2, 1, 0):  # FlexAttention's mods take scalars: map them over (batch, head, query, key)
            fn = torch.vmap(fn, in_dims=(0,) + tuple(0 if i == dim else None for i in range(4)))
        b, h, i, j = (torch.arange(n, device=q.device) for n in scores.shape)
        scores = fn(scores, b, h, i, j)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores.to(torch.float64 if upcast else torch.float32), dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of -inf alone gives NaN
    return probs.to(v.dtype) @ v, lse
