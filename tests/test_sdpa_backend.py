"""flashattn2.sdpa_backend: flashattn2 as the kernels of torch's SDPA FLASH_ATTENTION backend.

The registry part (registration, activation, restore, the version error, the schemas) runs anywhere. The aten ops
run on flashattn2 through the `overridden` fixture: on the CPU it overrides them for the CPU dispatch key (they
have no CPU kernel of their own) and the kernels run in the Triton interpreter; on a GPU it activates the backend.
The tests call the ops directly, so torch's autograd formulas take them to the backward ops, as SDPA's do. The
gpu-marked tests go through F.scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION) and compare with
torch's own FLASH kernels.
"""

import importlib
import inspect
import subprocess
import sys

import pytest
import torch
import torch.nn.attention as attention
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn2 import ops, sdpa_backend
from flashattn2.checks import attn_options
from helpers import (
    BWD_FACTOR,
    DEVICE,
    FWD_FACTOR,
    ON_GPU,
    assert_close_to_ref,
    check_attention,
    check_varlen,
    randn,
)

HAS_REGISTRY = hasattr(attention, "register_flash_attention_impl")
HAS_RESTORE = hasattr(attention, "restore_flash_attention_impl")
needs_torch_2_11 = pytest.mark.skipif(not HAS_RESTORE, reason="needs torch >= 2.11 (restore_flash_attention_impl)")


@pytest.fixture(autouse=True)
def _default_impl_after():
    """Every test leaves torch's default flash kernels behind it."""
    yield
    if HAS_RESTORE and attention.current_flash_attention_impl() is not None:
        attention.restore_flash_attention_impl()


@pytest.fixture
def overridden():
    """The aten flash ops on flashattn2 for DEVICE's tensors."""
    if ON_GPU:
        with sdpa_backend.sdpa_flash_backend():
            yield
        return
    handle = sdpa_backend._register_kernels("CPU")
    try:
        yield
    finally:
        handle.remove()


# ----------------------------------------------------------------------------------------------
# the registry


@needs_torch_2_11
def test_import_registers_without_activating():
    code = ("import torch.nn.attention as a, flashattn2.sdpa_backend as s; count = lambda: "
            "a.list_flash_attention_impls().count('FLASHATTN2'); imported = count(); s.register(); "
            "print(a.current_flash_attention_impl(), imported, count())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # registered once by the import, still once after register() again, and not active
    assert result.stdout.split() == ["None", "1", "1"], result.stderr


@needs_torch_2_11
def test_activate_restore_and_the_context_manager():
    assert attention.current_flash_attention_impl() is None
    sdpa_backend.activate()
    assert attention.current_flash_attention_impl() == "FLASHATTN2"
    with sdpa_backend.sdpa_flash_backend():  # already active: stays active after the block
        assert attention.current_flash_attention_impl() == "FLASHATTN2"
    assert attention.current_flash_attention_impl() == "FLASHATTN2"
    sdpa_backend.restore()
    assert attention.current_flash_attention_impl() is None
    with pytest.raises(KeyError), sdpa_backend.sdpa_flash_backend():  # torch's default comes back on an exception
        assert attention.current_flash_attention_impl() == "FLASHATTN2"
        raise KeyError
    assert attention.current_flash_attention_impl() is None


@needs_torch_2_11
def test_the_context_manager_gives_back_another_impl():
    events = []

    class Handle:
        def remove(self):
            events.append("removed")

    def register_fn():
        events.append("activated")
        return Handle()

    attention.register_flash_attention_impl("FLASHATTN2_TEST_OTHER", register_fn=register_fn)
    try:
        attention.activate_flash_attention_impl("FLASHATTN2_TEST_OTHER")
        with sdpa_backend.sdpa_flash_backend():
            assert attention.current_flash_attention_impl() == "FLASHATTN2"
        assert attention.current_flash_attention_impl() == "FLASHATTN2_TEST_OTHER"
        assert events == ["activated", "removed", "activated"]
    finally:
        attention.restore_flash_attention_impl()
        # torch has no unregister: drop the test's entry from its registry
        importlib.import_module("torch.nn.attention._registry")._FLASH_ATTENTION_IMPLS.pop("FLASHATTN2_TEST_OTHER")


def test_old_torch_raises_naming_the_version(monkeypatch):
    for name in ("register_flash_attention_impl", "activate_flash_attention_impl", "restore_flash_attention_impl",
                 "current_flash_attention_impl"):
        monkeypatch.delattr(attention, name, raising=False)
    importlib.reload(sdpa_backend)  # importing does not fail
    version = torch.__version__.replace("+", r"\+")
    with pytest.raises(RuntimeError, match=rf"torch >= 2\.10 .*register_flash_attention_impl.*torch {version}"):
        sdpa_backend.register()
    with pytest.raises(RuntimeError, match=r"torch >= 2\.10 .*activate_flash_attention_impl"):
        sdpa_backend.activate()
    with pytest.raises(RuntimeError, match=r"torch >= 2\.11 .*restore_flash_attention_impl"):
        sdpa_backend.restore()
    with pytest.raises(RuntimeError, match=r"torch >= 2\.10"), sdpa_backend.sdpa_flash_backend():
        pass


def test_restore_on_torch_2_10_raises_before_activating(monkeypatch):
    if not HAS_REGISTRY:
        pytest.skip("needs torch >= 2.10 (register_flash_attention_impl)")
    monkeypatch.delattr(attention, "restore_flash_attention_impl", raising=False)
    with pytest.raises(RuntimeError, match=r"torch >= 2\.11"), sdpa_backend.sdpa_flash_backend():
        pass
    assert attention.current_flash_attention_impl() is None


# ----------------------------------------------------------------------------------------------
# the overrides' signatures


@pytest.mark.parametrize("op", sorted(sdpa_backend._IMPLS))
def test_impl_parameters_are_the_schemas(op):
    if not hasattr(torch.ops.aten, op):
        pytest.skip(f"this torch has no aten::{op}")
    schema = getattr(torch.ops.aten, op).default._schema
    params = inspect.signature(sdpa_backend._IMPLS[op]).parameters
    positional = [p.name for p in params.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == [a.name for a in schema.arguments if not a.kwarg_only]
    named = {name for name, p in params.items() if p.kind is not p.VAR_KEYWORD}
    for arg in schema.arguments:
        if arg.name not in named:
            # another torch's keyword argument: it reaches **unknown, refused by name (next test)
            assert arg.kwarg_only and any(p.kind is p.VAR_KEYWORD for p in params.values()), arg.name
            continue
        param = params[arg.name]
        assert param.kind is (param.KEYWORD_ONLY if arg.kwarg_only else param.POSITIONAL_OR_KEYWORD), arg.name
        # the dispatcher leaves out arguments at their defaults, so the defaults must be the schema's
        expected = arg.default_value if arg.has_default_value() else inspect.Parameter.empty
        assert param.default == expected, f"{arg.name}: default {param.default!r}, schema {expected!r}"
    schema_names = {a.name for a in schema.arguments}
    for name in named - schema_names:
        # an argument of another torch: never passed here, so it must be optional
        assert params[name].kind is params[name].KEYWORD_ONLY and params[name].default is None, name


def _dense(*shape, dtype=torch.bfloat16, requires_grad=False):
    return randn(*shape, dtype=dtype, requires_grad=requires_grad)


@pytest.mark.skipif(ON_GPU, reason="the CPU dispatch key, where torch has no kernel of its own for these ops")
def test_remove_drops_every_override():
    q = _dense(1, 8, 2, 32)
    handle = sdpa_backend._register_kernels("CPU")
    torch.ops.aten._flash_attention_forward(q, q, q, None, None, 8, 8, 0.0, False, False)  # flashattn2's
    handle.remove()
    handle.remove()  # torch's registry may call it again: a no-op
    with pytest.raises(NotImplementedError, match="CPU"):
        torch.ops.aten._flash_attention_forward(q, q, q, None, None, 8, 8, 0.0, False, False)
    with pytest.raises(NotImplementedError, match="CPU"):
        torch.ops.aten._scaled_dot_product_flash_attention(q, q, q)


def test_unsupported_arguments_raise_naming_them():
    q, k = _dense(1, 8, 2, 32), _dense(1, 8, 2, 32)
    fwd = sdpa_backend._flash_attention_forward
    for name in ("seqused_k", "alibi_slopes", "block_table", "k_cache"):  # k_cache: another torch's argument
        with pytest.raises(NotImplementedError, match=name):
            fwd(q, k, k, None, None, 8, 8, 0.0, False, False, **{name: torch.ones(1)})
    with pytest.raises(NotImplementedError, match="return_debug_mask"):
        fwd(q, k, k, None, None, 8, 8, 0.0, False, True)
    with pytest.raises(ValueError, match="cum_seq_q and cum_seq_k"):
        fwd(q[0], k[0], k[0], torch.tensor([0, 8], dtype=torch.int32), None, 8, 8, 0.0, False, False)
    with pytest.raises(NotImplementedError, match="return_debug_mask"):
        sdpa_backend._scaled_dot_product_flash_attention(q, k, k, 0.0, False, True)
    with pytest.raises(NotImplementedError, match="philox_extra"):
        sdpa_backend._scaled_dot_product_flash_attention_backward(
            q, q, k, k, q, None, None, None, 8, 8, 0.0, False, None, None, philox_extra=1)
    inplace = sdpa_backend._flash_attention_forward_no_dropout_inplace
    with pytest.raises(ValueError, match="dropout_p"):
        inplace(torch.empty_like(q), q, k, k, None, None, 8, 8, 0.1, False, False)


# ----------------------------------------------------------------------------------------------
# the ops, called directly (torch's autograd formulas call the backward ops)


def _sdpa_inputs(batch, heads, heads_k, seqlen_q, seqlen_k, head_dim, layout, dtype=torch.bfloat16):
    """(batch, heads, seqlen, dim) q, k, v: contiguous ("bhsd") or views of (batch, seqlen, heads, dim) ("bshd")."""
    def make(h, s):
        if layout == "bhsd":
            return _dense(batch, h, s, head_dim, dtype=dtype, requires_grad=True)
        return _dense(batch, s, h, head_dim, dtype=dtype).transpose(1, 2).requires_grad_()
    return make(heads, seqlen_q), make(heads_k, seqlen_k), make(heads_k, seqlen_k)


def _bshd(*tensors):
    return [x.transpose(1, 2) for x in tensors]


SDPA_CASES = [
    # batch, heads, heads_k, seqlen_q, seqlen_k, head_dim, causal, scale
    (2, 4, 4, 17, 17, 32, False, None),
    (2, 4, 4, 17, 17, 32, True, None),
    (1, 2, 2, 9, 33, 32, False, 0.3),
    (1, 2, 2, 33, 9, 64, True, None),  # causal, seqlen_q != seqlen_k: bottom-right, as aten's flash kernel
    (2, 8, 2, 16, 24, 64, True, None),  # GQA: fewer key/value heads reach the op (SDPA's enable_gqa)
]


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("batch,heads,heads_k,seqlen_q,seqlen_k,head_dim,causal,scale", SDPA_CASES)
def test_scaled_dot_product_flash_attention(overridden, batch, heads, heads_k, seqlen_q, seqlen_k, head_dim, causal,
                                            scale, layout):
    torch.manual_seed(seqlen_q * 13 + seqlen_k + heads_k)
    q, k, v = _sdpa_inputs(batch, heads, heads_k, seqlen_q, seqlen_k, head_dim, layout)
    out, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, debug_mask = (
        torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, is_causal=causal, scale=scale))
    # torch's return values: the output laid out like query, lse (batch, heads, seqlen_q) fp32, no cum_seq
    assert out.shape == q.shape and out.stride() == q.stride()
    assert lse.shape == (batch, heads, seqlen_q) and lse.dtype == torch.float32
    assert cum_q is None and cum_k is None and (max_q, max_k) == (seqlen_q, seqlen_k)
    assert rng_state.shape == (2,) and rng_state.dtype == unused.dtype == torch.uint64 and unused.dim() == 0
    assert debug_mask.numel() == 0
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for g, x in zip(grads, (q, k, v), strict=True):
        assert g.stride() == x.stride(), "gradients laid out like their inputs, as torch's meta functions say"
    check_attention(*_bshd(q, k, v, out), lse, _bshd(*grads), dout.transpose(1, 2), causal, scale)


@pytest.mark.parametrize("causal,window", [(False, (5, 3)), (True, (6, None)), (False, (None, 0))])
def test_flash_attention_forward_dense_with_window(overridden, causal, window):
    torch.manual_seed(7)
    q, k, v = (_dense(2, s, 4, 32, requires_grad=True) for s in (20, 28, 28))
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        q, k, v, None, None, 20, 28, 0.0, causal, False, window_size_left=window[0], window_size_right=window[1])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    window_size = tuple(-1 if w is None else w for w in window)
    check_attention(q, k, v, out, lse, grads, dout, causal, window_size=window_size)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_forward_packed_sequences(overridden, causal):
    torch.manual_seed(11 + causal)
    cu_q = torch.tensor([0, 5, 21, 30], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 9, 20, 41], dtype=torch.int32, device=DEVICE)
    q = _dense(30, 4, 32, requires_grad=True)
    k, v = _dense(41, 2, 32, requires_grad=True), _dense(41, 2, 32, requires_grad=True)
    out, lse, *_ = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, 16, 21, 0.0, causal, False)
    assert lse.shape == (4, 30)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_varlen(q, k, v, out, lse, grads, dout, cu_q, cu_k, causal=causal)


def test_flash_attention_forward_no_dropout_inplace(overridden):
    if not hasattr(torch.ops.aten, "_flash_attention_forward_no_dropout_inplace"):
        pytest.skip("this torch has no aten::_flash_attention_forward_no_dropout_inplace")
    torch.manual_seed(3)
    q, k, v = (_dense(2, s, 4, 32) for s in (12, 19, 19))
    expected, expected_lse, *_ = torch.ops.aten._flash_attention_forward(q, k, v, None, None, 12, 19, 0.0, True, False)
    out = torch.full_like(q, float("nan"))
    lse = torch.ops.aten._flash_attention_forward_no_dropout_inplace(out, q, k, v, None, None, 12, 19, 0.0, True,
                                                                      False)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)


def test_dropout_seed_reaches_the_backward(overridden):
    p, scale = 0.25, 0.2
    torch.manual_seed(5)
    q, k, v = _sdpa_inputs(2, 4, 2, 24, 40, 32, "bshd")
    torch.manual_seed(6)
    out, lse, *_, rng_state, _, _ = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, p, scale=scale)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    # the mask those kernels drew: flashattn2's probabilities dump, from the seed in rng_state
    qb, kb, vb = (x.detach() for x in _bshd(q, k, v))
    opts = attn_options(qb, None, None, 24, 40, p, scale, False, (-1, -1), 0.0, None, False)
    _, _, probs = ops.forward(qb, kb, vb, opts._replace(rng_seed=rng_state.view(torch.int64)[:1]), return_probs=True)
    check_attention(*_bshd(q, k, v, out), lse, _bshd(*grads), dout.transpose(1, 2), softmax_scale=scale,
                    dropout_p=p, dropout_mask=~torch.signbit(probs))
    # torch.manual_seed draws the same mask again
    torch.manual_seed(6)
    again = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, p, scale=scale)[0]
    assert torch.equal(again, out)


def test_compiled_code_reads_the_results_in_their_promised_layout(overridden):
    # inductor indexes an op's results by the strides of torch's meta function (those of query, key, value)
    torch._dynamo.reset()
    torch.manual_seed(9)
    q, k, v = _sdpa_inputs(2, 4, 2, 16, 24, 32, "bhsd")
    weight = torch.arange(32, dtype=torch.bfloat16, device=DEVICE)

    def f(q, k, v):
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, is_causal=True)[0] * weight

    dout = torch.randn(2, 4, 16, 32, dtype=torch.bfloat16, device=DEVICE)
    out, grads = _run(torch.compile(f, fullgraph=True), q, k, v, dout)
    eager_out, eager_grads = _run(f, q, k, v, dout)
    torch._dynamo.reset()
    for name, x, y in zip(("out", "dq", "dk", "dv"), (out, *grads), (eager_out, *eager_grads), strict=True):
        torch.testing.assert_close(x, y, msg=name)


# ----------------------------------------------------------------------------------------------
# GPU: F.scaled_dot_product_attention, against torch's own FLASH kernels


def _sdpa(q, k, v, backend=SDPBackend.FLASH_ATTENTION, **kwargs):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def _run(fn, q, k, v, dout, **kwargs):
    """out and (dq, dk, dv) of fn on fresh leaves, detached."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves, **kwargs)
    out.backward(dout.to(out.dtype))
    return out.detach(), [x.grad for x in leaves]


def _kernel_names(fn) -> list[str]:
    """The names of the CUDA kernels fn launches."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _ran_flashattn2(names) -> bool:
    return any("attention_fwd" in n for n in names) and not any("flash_fwd" in n for n in names)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch,heads,heads_k,seqlen_q,seqlen_k,head_dim,causal,scale", [
    (2, 8, 8, 1024, 1024, 64, False, None),
    (2, 8, 8, 1000, 1000, 128, True, None),
    (1, 4, 4, 333, 1111, 128, False, 0.1),
    (2, 16, 4, 512, 512, 128, True, None),  # GQA
    (1, 4, 4, 257, 257, 256, True, None),
])
def test_sdpa_on_flashattn2_matches_float64_by_torchs_flash_error(dtype, batch, heads, heads_k, seqlen_q, seqlen_k,
                                                                   head_dim, causal, scale):
    torch.manual_seed(seqlen_q + head_dim)
    q, k, v = _sdpa_inputs(batch, heads, heads_k, seqlen_q, seqlen_k, head_dim, "bshd", dtype)
    dout = torch.randn(batch, heads, seqlen_q, head_dim, dtype=dtype, device=DEVICE)
    kwargs = dict(is_causal=causal, scale=scale, enable_gqa=heads_k != heads)
    torch_out, torch_grads = _run(_sdpa, q, k, v, dout, **kwargs)
    ref_out, ref_grads = _run(_sdpa, q.double(), k.double(), v.double(), dout, backend=SDPBackend.MATH, **kwargs)
    with sdpa_backend.sdpa_flash_backend():
        out, grads = _run(_sdpa, q, k, v, dout, **kwargs)
        assert _ran_flashattn2(_kernel_names(lambda: _sdpa(q, k, v, **kwargs).backward(dout)))
    assert_close_to_ref("out", out, ref_out, torch_out, FWD_FACTOR)
    for name, g, r, t in zip(("dq", "dk", "dv"), grads, ref_grads, torch_grads, strict=True):
        assert_close_to_ref(name, g, r, t, BWD_FACTOR)


@pytest.mark.gpu
def test_backward_runs_flashattn2_kernels():
    torch.manual_seed(1)
    q, k, v = _sdpa_inputs(2, 4, 4, 512, 512, 64, "bshd")
    out_grad = torch.randn(2, 4, 512, 64, dtype=torch.bfloat16, device=DEVICE)
    with sdpa_backend.sdpa_flash_backend():
        names = _kernel_names(lambda: _sdpa(q, k, v, is_causal=True).backward(out_grad))
    assert any("attention_bwd" in n for n in names) and not any("flash_bwd" in n for n in names), names


@pytest.mark.gpu
def test_torch_compile_runs_flashattn2():
    torch._dynamo.reset()
    torch.manual_seed(2)
    q, k, v = _sdpa_inputs(2, 8, 2, 1024, 1024, 128, "bhsd")
    dout = torch.randn_like(q)
    compiled = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                             fullgraph=True)
    kwargs = dict(is_causal=True, enable_gqa=True)
    torch_out, torch_grads = _run(_sdpa, q, k, v, dout, **kwargs)
    ref_out, ref_grads = _run(_sdpa, q.double(), k.double(), v.double(), dout, backend=SDPBackend.MATH, **kwargs)
    with sdpa_backend.sdpa_flash_backend(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out, grads = _run(compiled, q, k, v, dout)
        names = _kernel_names(lambda: compiled(q, k, v).backward(dout))
    assert _ran_flashattn2(names) and any("attention_bwd" in n for n in names), names
    assert_close_to_ref("out", out, ref_out, torch_out, FWD_FACTOR)
    for name, g, r, t in zip(("dq", "dk", "dv"), grads, ref_grads, torch_grads, strict=True):
        assert_close_to_ref(name, g, r, t, BWD_FACTOR)
    torch._dynamo.reset()


@pytest.mark.gpu
def test_restore_gives_torchs_kernels_back():
    torch.manual_seed(4)
    q, k, v = _sdpa_inputs(2, 4, 4, 700, 700, 128, "bshd")
    before = _sdpa(q, k, v, is_causal=True)
    with sdpa_backend.sdpa_flash_backend():
        assert _ran_flashattn2(_kernel_names(lambda: _sdpa(q, k, v, is_causal=True)))
    assert attention.current_flash_attention_impl() is None
    names = _kernel_names(lambda: _sdpa(q, k, v, is_causal=True))
    assert any("flash_fwd" in n for n in names) and not any("attention_fwd" in n for n in names), names
    assert torch.equal(_sdpa(q, k, v, is_causal=True), before), "torch's forward is deterministic"


@pytest.mark.gpu
def test_transformers_sdpa_model_runs_on_flashattn2():
    # a tiny Llama with attn_implementation="sdpa" (no padding: SDPA's causal path, which FLASH takes) under the
    # activated backend: logits and parameter gradients against float64 eager by flash_attn's rule, our kernels
    # in the profile
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    ref = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(DEVICE, torch.float64)
    models = {}
    for role in ("ours", "torch"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        model.load_state_dict(ref.state_dict())
        models[role] = model.to(DEVICE, torch.bfloat16)
    ids = torch.randint(0, 128, (2, 200), device=DEVICE)

    def run(model):
        logits = model(ids).logits
        logits.float().square().mean().backward()
        return logits.detach(), model.model.layers[0].self_attn.q_proj.weight.grad

    ref_logits, ref_grad = run(ref)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        torch_logits, torch_grad = run(models["torch"])
        with sdpa_backend.sdpa_flash_backend():
            names = _kernel_names(lambda: models["ours"](ids).logits.sum().backward())
            models["ours"].zero_grad()
            logits, grad = run(models["ours"])
    assert _ran_flashattn2(names) and any("attention_bwd" in n for n in names), names
    assert_close_to_ref("logits", logits, ref_logits, torch_logits, FWD_FACTOR)
    assert_close_to_ref("q_proj grad", grad, ref_grad, torch_grad, BWD_FACTOR)


@pytest.mark.gpu
def test_sdpa_forward_and_backward_replay_in_a_cuda_graph():
    # SDPA's FLASH ops on flashattn2 captured in a CUDA graph (forward and backward) and replayed on new inputs:
    # the checks run at capture, the replay only runs kernels; results equal an eager call's
    torch.manual_seed(5)
    q, k, v = _sdpa_inputs(2, 4, 2, 640, 640, 128, "bhsd")
    dout = torch.randn(2, 4, 640, 128, dtype=torch.bfloat16, device=DEVICE)
    static = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    with sdpa_backend.sdpa_flash_backend(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside capture: compiles and plans
            for _ in range(2):
                F.scaled_dot_product_attention(*static, is_causal=True, enable_gqa=True).backward(dout)
        torch.cuda.current_stream().wait_stream(side)
        for x in static:
            x.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = F.scaled_dot_product_attention(*static, is_causal=True, enable_gqa=True)
            out.backward(dout)
        fresh = [torch.randn_like(x) for x in (q, k, v)]
        for x, new in zip(static, fresh, strict=True):
            x.data.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        eager_out, eager_grads = _run(_sdpa, *fresh, dout, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, eager_out, atol=0, rtol=0)
    for g, e in zip((x.grad for x in static), eager_grads, strict=True):
        torch.testing.assert_close(g, e, atol=1e-2, rtol=1e-2)  # dQ sums by atomics: not bitwise
