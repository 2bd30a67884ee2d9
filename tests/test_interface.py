"""API contract: bad input raises a named error, unsupported options are refused by name, and the ops
behave under autograd checks and torch.compile."""

import pytest
import torch

import flashattn2
from flashattn2 import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashattn2.kernels.portable import cu_seqlens
from helpers import DEVICE, ON_GPU, randn


def qkv(batch=1, seqlen_q=8, seqlen_k=8, nheads=2, nheads_k=2, head_dim=32, dtype=torch.float16,
        device=DEVICE):
    return (randn(batch, seqlen_q, nheads, head_dim, dtype=dtype, device=device),
            randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype, device=device),
            randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype, device=device))


def test_public_api_names():
    for name in ("flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_combine",
                 "apply_rotary_emb", "attention_backend", "set_backend", "get_backend"):
        assert callable(getattr(flashattn2, name))


def test_get_backend_reads_set_backend():
    before = flashattn2.get_backend()
    try:
        flashattn2.set_backend("triton")
        assert flashattn2.get_backend() == "triton"
    finally:
        flashattn2.set_backend(before)
    assert flashattn2.get_backend() == before


@pytest.mark.parametrize("make,error,match", [
    (lambda: (randn(8, 2, 32, dtype=torch.float16), *qkv()[1:]), ValueError, "4 dimensions"),
    (lambda: (qkv()[0], randn(1, 1, 8, 2, 32, dtype=torch.float16), qkv()[2]), ValueError, "4 dimensions"),
    (lambda: (qkv(batch=2)[0], *qkv()[1:]), ValueError, "batch"),
    (lambda: (*qkv()[:2], qkv(seqlen_k=9)[2]), ValueError, "same seqlen"),
    (lambda: (qkv(head_dim=64)[0], *qkv()[1:]), ValueError, "head dims"),
    (lambda: (*qkv()[:2], qkv(nheads=3, nheads_k=3)[2]), ValueError, "same number of heads"),
    (lambda: qkv(nheads=3, nheads_k=2), ValueError, "divisible"),
    (lambda: qkv(head_dim=288), ValueError, "head dim must be between"),
    (lambda: qkv(dtype=torch.float32), TypeError, "float16 and bfloat16"),
    (lambda: qkv(dtype=torch.float64), TypeError, "float16 and bfloat16"),
    (lambda: (qkv()[0], *qkv(dtype=torch.bfloat16)[1:]), TypeError, "one dtype"),
    (lambda: (qkv()[0], qkv(device="meta")[1], qkv()[2]), ValueError, "one device"),
    (lambda: (torch.ones(1, 8, 2, 32, dtype=torch.int32, device=DEVICE), *qkv()[1:]), TypeError, "float16"),
    (lambda: ([[1.0]], *qkv()[1:]), TypeError, "torch.Tensor"),
])
def test_bad_inputs_raise_named_errors(make, error, match):
    with pytest.raises(error, match=match):
        flash_attn_func(*make())


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_softmax_scale(scale):
    with pytest.raises(ValueError, match="softmax_scale"):
        flash_attn_func(*qkv(), softmax_scale=scale)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"dropout_p": 1.0}, ValueError, "dropout_p"),
    ({"dropout_p": -0.1}, ValueError, "dropout_p"),
    ({"window_size": (4,)}, ValueError, "window_size"),
    ({"softcap": -1.0}, ValueError, "softcap"),
    ({"alibi_slopes": torch.ones(2, dtype=torch.float16)}, TypeError, "alibi_slopes must be float32"),
    ({"alibi_slopes": torch.ones(3, dtype=torch.float32)}, ValueError, "alibi_slopes must have shape"),
    ({"alibi_slopes": [0.5, 0.25]}, TypeError, "alibi_slopes must be a torch.Tensor"),
])
def test_bad_options_raise_named_errors(kwargs, error, match):
    kwargs = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    for call in (lambda: flash_attn_func(*qkv(), **kwargs),
                 lambda: flash_attn_qkvpacked_func(torch.stack(qkv(), dim=2), **kwargs),
                 lambda: flash_attn_kvpacked_func(qkv()[0], torch.stack(qkv()[1:], dim=2), **kwargs)):
        with pytest.raises(error, match=match):
            call()


def _varlen(total_q=10, total_k=12, nheads=2, head_dim=32):
    q = randn(total_q, nheads, head_dim, dtype=torch.float16)
    k, v = (randn(total_k, nheads, head_dim, dtype=torch.float16) for _ in range(2))
    cu_q = torch.tensor([0, 4, total_q], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 5, total_k], dtype=torch.int32, device=DEVICE)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("change,error,match", [
    (lambda a: {**a, "q": a["q"][None]}, ValueError, "3 dimensions"),
    (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].long()}, TypeError, "int32"),
    (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"][:2]}, ValueError, "same length"),
    (lambda a: {**a, "max_seqlen_q": -1}, ValueError, "max_seqlen_q"),
    (lambda a: {**a, "max_seqlen_q": 3}, ValueError, "longer than max_seqlen"),
    (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"] + 1}, ValueError, "must start at 0"),
    (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"].flip(0)}, ValueError, "must start at 0"),
    # with a block table, k and v are page pools (num_blocks, page_block_size, nheads_k, headdim)
    (lambda a: {**a, "block_table": torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)}, ValueError,
     "with block_table, k must be"),
])
def test_bad_varlen_inputs_raise_named_errors(change, error, match):
    from flashattn2 import flash_attn_varlen_func

    q, k, v, cu_q, cu_k = _varlen()
    args = change({"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": 6,
                   "max_seqlen_k": 7})
    with pytest.raises(error, match=match):
        flash_attn_varlen_func(**args)
        # the values of cu_seqlens are judged on the device, after the call: a GPU may report them later
        if ON_GPU:
            torch.cuda.synchronize()
            cu_seqlens.raise_pending(q.device)


def test_packed_shapes_are_checked():
    with pytest.raises(ValueError, match="qkv must have shape"):
        flash_attn_qkvpacked_func(randn(1, 8, 2, 2, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match="kv must have shape"):
        flash_attn_kvpacked_func(qkv()[0], randn(1, 8, 3, 2, 32, dtype=torch.float16))


@pytest.mark.skipif(ON_GPU, reason="CPU tensors are fine on a GPU machine only through the interpreter")
def test_cpu_tensors_without_interpreter_are_refused(monkeypatch):
    import flashattn2.checks as checks

    monkeypatch.setattr(checks, "INTERPRET", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        flash_attn_func(*qkv(device="cpu"))


def test_non_unit_last_stride_is_copied_not_refused():
    q, k, v = qkv(head_dim=32)
    q_strided = torch.empty(1, 8, 2, 64, dtype=q.dtype, device=q.device)[..., ::2]
    q_strided.copy_(q)
    assert q_strided.stride(-1) == 2
    torch.testing.assert_close(flash_attn_func(q_strided, k, v), flash_attn_func(q, k, v), rtol=0, atol=0)


def test_opcheck():
    """torch.library's own checks: schema, fake (meta) kernel, autograd registration."""
    q, k, v = (x.requires_grad_() for x in qkv(seqlen_q=20, seqlen_k=24, head_dim=16))
    scale = 0.25
    # q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng_seed, max_seqlen_q, max_seqlen_k,
    # softmax_scale, window_left, window_right, softcap, dropout_p, deterministic, return_probs
    slopes = torch.rand(2, dtype=torch.float32, device=DEVICE)
    fwd_args = (q, k, v, None, None, slopes, None, 20, 24, scale, 5, 0, 2.0, 0.0, False, False)
    torch.library.opcheck(torch.ops.flashattn2.fwd.default, fwd_args,
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    detached = tuple(x.detach() for x in (q, k, v))
    out, lse, _ = torch.ops.flashattn2.fwd(*detached, *fwd_args[3:])
    dout = randn(*out.shape, dtype=out.dtype)
    torch.library.opcheck(torch.ops.flashattn2.bwd.default,
                          (dout, *detached, out, lse, None, None, slopes, None, 20, 24, scale, 5, 0, 2.0, 0.0, False),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("features", [{}, {"window_size": (8, 0), "softcap": 5.0, "alibi": True}],
                         ids=["plain", "window-softcap-alibi"])
def test_torch_compile_fullgraph_matches_eager(features):
    q, k, v = (x.requires_grad_() for x in qkv(seqlen_q=33, seqlen_k=40, nheads=4, nheads_k=2))
    backend = "inductor" if ON_GPU else "aot_eager"  # inductor on CPU would need a C++ toolchain in CI
    kwargs = {key: value for key, value in features.items() if key != "alibi"}
    if features.get("alibi"):
        kwargs["alibi_slopes"] = torch.rand(4, dtype=torch.float32, device=DEVICE)

    def layer(q, k, v):
        return flash_attn_func(q * 1.0, k, v, causal=True, **kwargs).float().square().sum()

    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    loss_c = compiled(q, k, v)
    grads_c = torch.autograd.grad(loss_c, (q, k, v))
    loss_e = layer(q, k, v)
    grads_e = torch.autograd.grad(loss_e, (q, k, v))
    torch.testing.assert_close(loss_c, loss_e)
    for gc, ge in zip(grads_c, grads_e, strict=True):
        torch.testing.assert_close(gc, ge)


def test_torch_compile_varlen_fullgraph():
    from flashattn2 import flash_attn_varlen_func

    q, k, v, cu_q, cu_k = _varlen()
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    backend = "inductor" if ON_GPU else "aot_eager"

    def layer(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, causal=True).float().sum()

    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), layer(q, k, v))
