"""Row offsets past 2**31 elements inside one sequence: the LONG_ROWS variant of the Triton kernels (64-bit row
offsets), chosen from the shapes; every other shape keeps the 32-bit code."""


import pytest
import torch

import flashattn2
from flashattn2 import attention_ref, flash_attn_func, flash_attn_varlen_func
from flashattn2.checks import attn_options
from flashattn2.kernels import backends, common
from flashattn2.kernels.portable import backward, forward
from helpers import BWD_FACTOR, DEVICE, FWD_FACTOR, ON_GPU, assert_close_to_ref, randn, reference_with_grads


def test_the_flag_follows_the_shapes():
    meta = dict(device="meta", dtype=torch.bfloat16)
    assert not common.long_rows(1, torch.empty(1, 2**20 - 1, 16, 128, **meta))
    assert common.long_rows(1, torch.empty(1, 2**20, 16, 128, **meta))
    # a strided view (packed qkv) reaches the limit sooner than its contiguous output
    qkv = torch.empty(1, 2**19 + 2**18, 3, 16, 128, **meta)
    assert common.long_rows(1, qkv[:, :, 0])
    # packed (varlen) rows count along dim 0
    assert common.long_rows(0, torch.empty(2**21, 8, 128, **meta))


def _force_long_rows(monkeypatch):
    """The 64-bit variant on small shapes; the remembered plans are dropped so that new ones are made."""
    monkeypatch.setattr(forward, "long_rows", lambda *a: True)
    monkeypatch.setattr(backward, "long_rows", lambda *a: True)
    flashattn2.set_backend(backends.get_backend())


@pytest.fixture
def forced_long_rows(monkeypatch):
    _force_long_rows(monkeypatch)
    yield
    monkeypatch.undo()
    flashattn2.set_backend(backends.get_backend())


def _run(q, k, v, dout, **kw):
    out = flash_attn_func(q, k, v, **kw)
    return (out, *torch.autograd.grad(out, (q, k, v), dout))


def test_long_rows_variant_equals_the_short_one(monkeypatch):
    flashattn2.set_backend(backends.get_backend())
    torch.manual_seed(0)
    # a shape no other test uses, so no remembered plan hides the variant
    q = randn(2, 77, 6, 40, dtype=torch.bfloat16, requires_grad=True)
    k = randn(2, 91, 2, 40, dtype=torch.bfloat16, requires_grad=True)
    v = randn(2, 91, 2, 40, dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn_like(q)
    kw = dict(causal=True, window_size=(50, 0), deterministic=True)
    short = _run(q, k, v, dout, **kw)
    _force_long_rows(monkeypatch)
    assert forward.forward_plan(q, k, v, attn_options(
        q, None, None, 0, 0, 0.0, None, True, (50, 0), 0.0, None, True)).attend.named["LONG_ROWS"]
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    long = _run(q2, k2, v2, dout, **kw)
    for name, a, b in zip(("out", "dq", "dk", "dv"), short, long, strict=True):
        assert torch.equal(a, b), name
    ref = reference_with_grads(q, k, v, dout, **kw_ref(kw))
    pt = reference_with_grads(q, k, v, dout, upcast=False, **kw_ref(kw))
    assert_close_to_ref("out", long[0], ref[0], pt[0], FWD_FACTOR)
    for name, ours, r, p in zip(("dq", "dk", "dv"), long[1:], ref[2], pt[2], strict=True):
        assert_close_to_ref(name, ours, r, p, BWD_FACTOR)
    monkeypatch.undo()
    flashattn2.set_backend(backends.get_backend())


def kw_ref(kw):
    return {k: v for k, v in kw.items() if k != "deterministic"}


def test_long_rows_varlen(forced_long_rows):
    torch.manual_seed(1)
    cu = torch.tensor([0, 33, 33, 120], dtype=torch.int32, device=DEVICE)
    q, k, v = (randn(120, 3, 24, dtype=torch.float16) for _ in range(3))
    out = flash_attn_varlen_func(q, k, v, cu, cu, 87, 87, causal=True)
    for a, b in ((0, 33), (33, 120)):
        ref, _ = attention_ref(q[a:b][None], k[a:b][None], v[a:b][None], causal=True)
        pt, _ = attention_ref(q[a:b][None], k[a:b][None], v[a:b][None], causal=True, upcast=False)
        assert_close_to_ref(f"out[{a}:{b}]", out[a:b][None], ref, pt, FWD_FACTOR)


@pytest.mark.gpu
def test_two_million_tokens_with_a_window_on_the_gpu():
    # 2**21 rows x 8 heads x 128 = 2**31 elements per tensor: row offsets past 2**31; a window keeps it cheap
    seqlen, heads, dim, window = 2**21 + 64, 8, 128, 127
    q, k, v = (randn(1, seqlen, heads, dim, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    assert common.long_rows(1, q)
    out = flash_attn_func(q, k, v, causal=True, window_size=(window, 0))
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    # the last rows and their window, against the reference on that slice
    rows = slice(seqlen - 256, seqlen)
    keys = slice(seqlen - 256 - window, seqlen)
    qs, ks, vs = (x.detach()[:, s] for x, s in ((q, rows), (k, keys), (v, keys)))
    ref, _ = attention_ref(qs, ks, vs, causal=True, window_size=(window, 0))
    pt, _ = attention_ref(qs, ks, vs, causal=True, window_size=(window, 0), upcast=False)
    assert_close_to_ref("out (last rows)", out[:, rows], ref, pt, FWD_FACTOR)
    assert torch.isfinite(dq).all() and torch.isfinite(dk[:, -1024:]).all() and torch.isfinite(dv[:, :1024]).all()


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashattn2.kernels.portable import backward, forward

base = dict(HEAD_DIM=128, BLOCK_D=128, HAS_LEFT=True, HAS_RIGHT=True, IS_VARLEN=False, HAS_SOFTCAP=False,
            HAS_ALIBI=False, HAS_DROPOUT=False, USE_TMA=False, INTERPRET=False, CuSeqlensQ=None, CuSeqlensK=None,
            AlibiSlopes=None, Seed=None, QDescale=None, KDescale=None, VDescale=None, Sink=None, LONG_ROWS=True,
            IS_FP8=False, V_T=False, stride_vd=1, HEAD_DIM_V=0, BLOCK_DV=0)
# strides go as (batch, row, head) tuples, the row statistics' as (batch, head)
strides = dict({n: ("i32",) * 3 for n in ("stride_q", "stride_k", "stride_v", "stride_o", "stride_do", "stride_dq",
                                          "stride_dk", "stride_dv")}, stride_lse=("i32", "i32"))
ft = dict(strides, Q="*bf16", K="*bf16", V="*bf16", Out="*bf16", Lse="*fp32", qk_scale="fp32", softcap_in2="fp32",
          softcap_out="fp32", dropout_p="fp32")
bt = dict(ft, dOut="*bf16", Delta="*fp32", dQ="*fp32", dK="*bf16", dV="*bf16", softmax_scale="fp32")
# the FP8 forward: e4m3 inputs, descales, V read sequence-contiguous with a 64-bit head-dim stride
f8 = dict(ft, Q="*fp8e4nv", K="*fp8e4nv", V="*fp8e4nv", QDescale="*fp32", KDescale="*fp32", VDescale="*fp32")
fp8 = dict(BLOCK_M=128, BLOCK_N=128, IS_FP8=True, V_T=True, QDescale="runtime", KDescale="runtime",
           VDescale="runtime", stride_vd="runtime")
for kernel, types, extra in ((forward.attention_fwd_kernel, ft, dict(BLOCK_M=128, BLOCK_N=64)),
                             (forward.attention_fwd_kernel, f8, fp8),
                             (backward.attention_bwd_dkdv_kernel, bt, dict(BLOCK_M=64, BLOCK_N=128, ATOMIC_DQ=False,
                                                                           TMA_DQ=False)),
                             (backward.attention_bwd_dq_kernel, bt, dict(BLOCK_M=128, BLOCK_N=64))):
    names = kernel.arg_names
    consts = {k: v for k, v in dict(base, **extra).items() if k in names and v != "runtime"}
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
    src = ASTSource(kernel, sig, {(names.index(n),): v for n, v in consts.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8)).asm["ptx"]
    assert "mul.wide" in ptx or "mul.lo.s64" in ptx, kernel.__name__
"""


@pytest.mark.skipif(ON_GPU, reason="compile-only check for CPU CI; the GPU runs the kernels")
def test_long_rows_variants_compile_for_sm90(compile_child):
    # the interpreter runs Python, not Triton's compiler: a kernel it runs may still not compile
    run = compile_child.run(_COMPILE, [])
    assert run.returncode == 0, run.stderr[-4000:]
