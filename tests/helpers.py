"""Shared test helpers: random inputs, the flash_attn pass rule, and the device the suite runs on."""

import torch

from flashattn2.reference import attention_ref, within_tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"

# flash_attn's rule: our max error against the float64 oracle is at most FACTOR x the error of PyTorch
# doing the same math in the input dtype, plus a small absolute floor for exactly representable cases.
FWD_FACTOR = 2.0
BWD_FACTOR = 3.0
ABS_FLOOR = 1e-5


def randn(*shape, dtype, device=DEVICE, requires_grad=False, generator=None) -> torch.Tensor:
    x = torch.randn(*shape, dtype=torch.float32, device=device, generator=generator).to(dtype)
    return x.requires_grad_(requires_grad)


def assert_close_to_ref(name: str, ours: torch.Tensor, ref: torch.Tensor, pt: torch.Tensor, factor: float,
                        where: torch.Tensor | None = None) -> None:
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    nan = torch.isnan(ours)
    # where the NaN sit tells an unwritten tile (whole rows) from a bad operand (some columns)
    assert not nan.any(), (f"{name}: {int(nan.sum())} of {nan.numel()} NaN in output (an element was never "
                           f"written?), first at {nan.nonzero()[:4].tolist()}; the reference has "
                           f"{int(torch.isnan(ref).sum())}")
    passed, err, pt_err = within_tolerance(ours, ref, pt, factor, ABS_FLOOR, where)
    assert passed, (
        f"{name}: max error {err:.3e} > {factor} x PyTorch's {pt_err:.3e} + {ABS_FLOOR}")


def assert_bitwise_repeatable(run, q, k, v, dout, times: int, seed: int | None = None) -> None:
    """out = run(q, k, v), then its backward, `times` times: output and gradients must equal the first
    run's bit for bit. `seed` re-seeds torch before each run (dropout draws its seed from torch)."""
    first = None
    for _ in range(times):
        q.grad = k.grad = v.grad = None
        if seed is not None:
            torch.manual_seed(seed)
        out = run(q, k, v)
        out.backward(dout)
        result = (out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone())
        if first is None:
            first = result
        for name, a, b in zip(("out", "dq", "dk", "dv"), first, result, strict=True):
            assert torch.equal(a, b), f"{name} differs between runs"


def reference_with_grads(q, k, v, dout, upcast=True, **ref_kwargs):
    """Reference out, lse and (dq, dk, dv), in float64 (upcast) or in the input dtype."""
    # float64 leaves for the oracle, so its gradients are not rounded back to the input dtype
    leaves = [(x.detach().double() if upcast else x.detach().clone()).requires_grad_() for x in (q, k, v)]
    out, lse = attention_ref(*leaves, upcast=upcast, **ref_kwargs)
    out.backward(dout.to(out.dtype))
    return out.detach(), lse.detach(), tuple(x.grad for x in leaves)


def varlen_reference_with_grads(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, upcast=True, dropout_masks=None,
                                alibi_slopes=None, **ref_kwargs):
    """The reference run sequence by sequence on packed inputs; lse comes back as (nheads, total_q)."""
    outs, lses, grads = [], [], ([], [], [])
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        kwargs = dict(ref_kwargs)
        if alibi_slopes is not None:
            kwargs["alibi_slopes"] = alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes
        if dropout_masks is not None:
            kwargs["dropout_mask"] = dropout_masks[b:b + 1, :, :rows.stop - rows.start, :keys.stop - keys.start]
        out, lse, g = reference_with_grads(q[rows][None], k[keys][None], v[keys][None], dout[rows][None], upcast,
                                           **kwargs)
        outs.append(out[0])
        lses.append(lse[0])
        for acc, x in zip(grads, g, strict=True):
            acc.append(x[0])
    return torch.cat(outs), torch.cat(lses, dim=-1), tuple(torch.cat(x) for x in grads)


def _check_all(out, lse, grads, ref, pt):
    (ref_out, ref_lse, ref_grads), (pt_out, pt_lse, pt_grads) = ref, pt
    assert_close_to_ref("out", out, ref_out, pt_out, FWD_FACTOR)
    # lse: +inf exactly where a row sees no key, and close elsewhere
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse > 0), empty), "lse must be +inf exactly on rows seeing no key"
    assert_close_to_ref("lse", lse, ref_lse, pt_lse, FWD_FACTOR, where=~empty)
    if grads is not None:
        for name, g, rg, pg in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads, strict=True):
            assert_close_to_ref(name, g, rg, pg, BWD_FACTOR)


def check_attention(q, k, v, out, lse, grads, dout, causal=False, softmax_scale=None, **ref_kwargs) -> None:
    """Apply the pass rule to out, lse and (if given) the gradients against float64 and in-dtype refs."""
    ref_kwargs.update(causal=causal, softmax_scale=softmax_scale)
    _check_all(out, lse, grads, reference_with_grads(q, k, v, dout, True, **ref_kwargs),
               reference_with_grads(q, k, v, dout, False, **ref_kwargs))


def check_varlen(q, k, v, out, lse, grads, dout, cu_seqlens_q, cu_seqlens_k, **ref_kwargs) -> None:
    """check_attention for packed inputs, sequence by sequence."""
    _check_all(out, lse, grads,
               varlen_reference_with_grads(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, True, **ref_kwargs),
               varlen_reference_with_grads(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, False, **ref_kwargs))


def packed_sequences(q, k, v, cu_seqlens_q, cu_seqlens_k, lens_q, lens_k):
    """Each non-empty sequence of a packed batch: (its query slice, its key slice, its q, k, v detached as a batch
    of one)."""
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k, strict=True)):
        if lq == 0:
            continue
        sq = slice(int(cu_seqlens_q[i]), int(cu_seqlens_q[i]) + lq)
        sk = slice(int(cu_seqlens_k[i]), int(cu_seqlens_k[i]) + lk)
        yield sq, sk, [x.detach()[s][None] for x, s in ((q, sq), (k, sk), (v, sk))]


def compiled_in_one_graph(fn, *args):
    """fn under torch.compile(fullgraph=True), after checking that Dynamo traces it on these arguments as one
    graph with no break (inductor on the GPU; on the CPU, whose inductor compiles C++, the eager backend traces the
    same graph)."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    return torch.compile(fn, fullgraph=True, backend="inductor" if ON_GPU else "eager")
