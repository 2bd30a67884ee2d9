"""FP8 attention forward (float8_e4m3fn q, k, v with per-(batch, kv head) descales, bf16 out): against float64 on
the dequantised inputs, within 2x the error of PyTorch doing the same math with FP8 matmuls
(reference.attention_fp8_ref); the quantisation helper; bad input. CPU under the interpreter (which rounds P to
e4m3 on the bits and widens the matmuls to fp32, so the GPU's rounding points are kept) and the GPU."""

import pytest
import torch

from flashattn2 import flash_attn_func, flash_attn_varlen_func, quantize_fp8
from flashattn2.reference import attention_fp8_ref
from helpers import DEVICE, FWD_FACTOR, ON_GPU, assert_close_to_ref, randn

if ON_GPU and torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("FP8 attention needs sm_89 or newer", allow_module_level=True)


def _inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, outliers=False, seed=0):
    torch.manual_seed(seed)
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=torch.bfloat16)
    k = randn(batch, seqlen_k, nheads_k, head_dim, dtype=torch.bfloat16)
    v = randn(batch, seqlen_k, nheads_k, head_dim, dtype=torch.bfloat16)
    if outliers:
        # a few channels 10-100x larger, as real activations have (in k and v: q's too would square them)
        channels = torch.randperm(head_dim)[:3]
        for x in (k, v):
            x[..., channels] *= torch.tensor([10.0, 30.0, 100.0], dtype=torch.bfloat16, device=x.device)
    return q, k, v


def _check(q8, k8, v8, qd, kd, vd, out, **kw):
    ref, _ = attention_fp8_ref(q8, k8, v8, qd, kd, vd, **kw)
    pt, _ = attention_fp8_ref(q8, k8, v8, qd, kd, vd, upcast=False, **kw)
    assert out.dtype == torch.bfloat16
    assert_close_to_ref("out", out, ref, pt, FWD_FACTOR)


CASES = [
    # batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, kwargs
    (2, 37, 53, 2, 2, 64, dict()),
    (2, 37, 53, 4, 2, 64, dict(causal=True)),
    (1, 64, 40, 3, 1, 32, dict(causal=True)),
    (2, 33, 33, 2, 1, 128, dict(window_size=(9, 3))),
    (1, 45, 45, 2, 2, 64, dict(causal=True, softcap=5.0)),
    (1, 45, 70, 2, 2, 64, dict(causal=True, softmax_scale=0.3)),
    (1, 30, 30, 2, 2, 40, dict()),
]
if ON_GPU:
    CASES += [(2, 1000, 1000, 8, 2, 128, dict(causal=True)), (1, 777, 2049, 4, 4, 256, dict()),
              (4, 513, 513, 16, 16, 64, dict(causal=True)), (1, 2048, 2048, 16, 4, 128, dict()),
              # d64 causal past 1k rows: the Triton FP8 forward's (64, 128) tiles under auto
              (1, 1500, 1500, 4, 2, 64, dict(causal=True)),
              # non-causal on the Triton FP8 forward's (64, 128) tiles past 512 rows at d64 (under auto) and 1k at
              # d128 (forced), keys not a multiple of the tile
              (1, 1100, 900, 4, 1, 64, dict()), (2, 1100, 1000, 4, 2, 128, dict())]


@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,nheads,nheads_k,head_dim,kw", CASES)
@pytest.mark.parametrize("outliers", [False, True])
def test_fp8_forward_matches_dequantised_float64(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, kw,
                                                 outliers):
    q, k, v = _inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, outliers, seed=seqlen_q + head_dim)
    q8, k8, v8, qd, kd, vd = quantize_fp8(q, k, v)
    out = flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, **kw)
    _check(q8, k8, v8, qd, kd, vd, out, **kw)


def _relabelled(n: torch.Tensor) -> torch.Tensor:
    # the Gluon FP8 forward's key relabelling, written out: key 64g + 8j + 2t + i sits at 64g + 16t + 2j + i
    return n // 64 * 64 + n // 2 % 4 * 16 + n // 8 % 8 * 2 + n % 2


@pytest.mark.parametrize("relabel", [False, True])
@pytest.mark.parametrize("shape", [(2, 77, 3, 16), (1, 300, 2, 64), (3, 32, 1, 40), (2, 1, 2, 256), (200, 5, 2)])
def test_v_keys_last_is_a_padded_transpose(shape, relabel):
    # FP8's V layout, built independently: keys last, zero-padded to a multiple of 16 (64 when relabelled)
    from flashattn2.kernels.portable.v_layout import v_keys_last

    torch.manual_seed(len(shape) + shape[1])
    wide = randn(*shape[:-2], 2 * shape[-2], shape[-1], dtype=torch.float32).to(torch.float8_e4m3fn)
    v = wide[..., ::2, :]  # heads strided: any layout with a unit last stride is taken
    multiple = 64 if relabel else 16
    got = v_keys_last(v, multiple, relabel)
    x = v if v.dim() == 4 else v[None]
    keys = -(-x.shape[1] // multiple) * multiple
    want = torch.zeros(*x.shape[:1], x.shape[2], x.shape[3], keys, dtype=torch.uint8, device=v.device)
    at = torch.arange(x.shape[1], device=v.device)
    want[..., _relabelled(at) if relabel else at] = x.view(torch.uint8).permute(0, 2, 3, 1)
    assert got.dtype == v.dtype
    assert torch.equal(got.view(torch.uint8), want if v.dim() == 4 else want[0])


@pytest.mark.parametrize("shape", [(2, 77, 3, 16), (200, 5, 2)])
def test_keys_last_layout_is_what_keys_last_makes(shape):
    # the Triton FP8 plan bakes the copy's strides in from keys_last_layout before any copy exists
    from flashattn2.kernels.portable.v_layout import keys_last, keys_last_layout

    v = randn(*shape, dtype=torch.float32).to(torch.float8_e4m3fn)
    made, planned = keys_last(v), keys_last_layout(v)
    assert (made.shape, made.stride(), made.dtype) == (planned.shape, planned.stride(), planned.dtype)
    assert torch.equal(made.view(torch.uint8), v.view(torch.uint8))


def test_relabelled_p_and_v_keep_p_v():
    # the Gluon kernel's P store (sm90.forward._keep_p: reshape, permute) against v_keys_last's V relabelling
    from flashattn2.kernels.portable.v_layout import v_keys_last

    torch.manual_seed(3)
    v = randn(1, 200, 1, 32, dtype=torch.float32).to(torch.float8_e4m3fn)
    vt = v_keys_last(v, 64, relabel=True)[0, 0].float()  # (head_dim, 256 keys)
    p = torch.rand(64, 256, device=v.device)
    p[:, 200:] = 0.0  # masked: keys past the sequence
    p_stored = p.reshape(64, 4, 8, 4, 2).permute(0, 1, 3, 2, 4).reshape(64, 256)
    torch.testing.assert_close(p_stored @ vt.T, p[:, :200] @ v[0, :, 0].float(), rtol=1e-5, atol=1e-5)


def test_v_keys_last_launches_apart_by_relabelling_and_padding():
    # one V, copied plain, relabelled, and padded to another multiple: each copy is what its arguments ask for, not a
    # launch cached for another (v_layout._launches)
    from flashattn2.kernels.portable.v_layout import v_keys_last

    v = randn(1, 200, 1, 32, dtype=torch.float32).to(torch.float8_e4m3fn)
    plain = v_keys_last(v, 64)[0, 0].float()  # (head_dim, 256 keys)
    relabelled = v_keys_last(v, 64, relabel=True)[0, 0].float()
    short = v_keys_last(v, 16)[0, 0].float()
    assert plain.shape == relabelled.shape == (32, 256) and short.shape == (32, 208)
    torch.testing.assert_close(plain[:, :200], v[0, :, 0].float().T, rtol=0, atol=0)
    torch.testing.assert_close(short[:, :200], plain[:, :200], rtol=0, atol=0)
    moved = plain.reshape(32, 4, 8, 4, 2).permute(0, 1, 3, 2, 4).reshape(32, 256)
    torch.testing.assert_close(relabelled, moved, rtol=0, atol=0)
    assert not torch.equal(relabelled, plain)


def test_fp8_alibi_and_lse():
    q, k, v = _inputs(2, 40, 56, 4, 2, 64, seed=5)
    slopes = torch.rand(2, 4, device=DEVICE) * 0.3
    q8, k8, v8, qd, kd, vd = quantize_fp8(q, k, v)
    out, lse, probs = flash_attn_func(q8, k8, v8, causal=True, alibi_slopes=slopes, return_attn_probs=True,
                                      q_descale=qd, k_descale=kd, v_descale=vd)
    _check(q8, k8, v8, qd, kd, vd, out, causal=True, alibi_slopes=slopes)
    _, ref_lse = attention_fp8_ref(q8, k8, v8, qd, kd, vd, causal=True, alibi_slopes=slopes)
    assert probs is None
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-4, atol=1e-4)


def test_descales_matter_per_batch_and_head():
    # different scales per (batch, kv head): a kernel reading the wrong entry fails this
    q, k, v = _inputs(2, 24, 24, 4, 2, 32, seed=11)
    q8, k8, v8, qd, kd, vd = quantize_fp8(q * torch.tensor([1.0, 8.0], device=DEVICE)[:, None, None, None].to(q.dtype),
                                          k, v * torch.tensor([3.0, 0.25], device=DEVICE).to(v.dtype)[None, None, :,
                                                                                                         None])
    assert qd[1, 0] > 4 * qd[0, 0] and vd[0, 0] > 4 * vd[0, 1]
    out = flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    _check(q8, k8, v8, qd, kd, vd, out)


def test_fp8_varlen_matches_per_sequence():
    torch.manual_seed(2)
    cu = torch.tensor([0, 17, 17, 60], dtype=torch.int32, device=DEVICE)
    q, k, v = (randn(60, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    q8, k8, v8, qd, kd, vd = quantize_fp8(q, k, v, cu, cu)
    assert qd.shape == (3, 2)
    out = flash_attn_varlen_func(q8, k8, v8, cu, cu, 43, 43, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.shape == (60, 4, 64) and out.dtype == torch.bfloat16
    for b, (lo, hi) in enumerate(((0, 17), (17, 60))):
        seq = 0 if b == 0 else 2
        ref, _ = attention_fp8_ref(q8[None, lo:hi], k8[None, lo:hi], v8[None, lo:hi], qd[seq:seq + 1],
                                   kd[seq:seq + 1], vd[seq:seq + 1], causal=True)
        pt, _ = attention_fp8_ref(q8[None, lo:hi], k8[None, lo:hi], v8[None, lo:hi], qd[seq:seq + 1],
                                  kd[seq:seq + 1], vd[seq:seq + 1], causal=True, upcast=False)
        assert_close_to_ref(f"out[{lo}:{hi}]", out[None, lo:hi], ref, pt, FWD_FACTOR)


def test_quantize_round_trip_and_varlen_agrees_with_dense():
    torch.manual_seed(4)
    q, k, v = _inputs(3, 20, 20, 4, 2, 16, outliers=True)
    q8, k8, v8, qd, kd, vd = quantize_fp8(q, k, v)
    for x, x8, d, group in ((q, q8, qd, 2), (k, k8, kd, 1), (v, v8, vd, 1)):
        assert x8.dtype == torch.float8_e4m3fn and d.shape == (3, 2) and d.dtype == torch.float32
        back = x8.float() * d.repeat_interleave(group, dim=1)[:, None, :, None]
        # e4m3 keeps 3 mantissa bits: relative error at most 2**-4 on normal values, 2**-10 x scale below
        bound = x.float().abs() * 2**-4 + d.repeat_interleave(group, dim=1)[:, None, :, None] * 2**-9
        assert (back - x.float()).abs().le(bound * 1.001).all()
        assert x8.float().abs().amax() == 448.0  # each block's largest value lands on e4m3's largest
    cu = torch.tensor([0, 20, 40, 60], dtype=torch.int32, device=DEVICE)
    packed = quantize_fp8(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu)
    for a, b in zip(packed[3:], (qd, kd, vd), strict=True):
        torch.testing.assert_close(a, b)
    assert torch.equal(packed[0].view(torch.uint8), q8.flatten(0, 1).view(torch.uint8))


def _fp8_args(batch=1, nheads_k=2):
    q, k, v = _inputs(batch, 16, 16, 2 * nheads_k, nheads_k, 32)
    return quantize_fp8(q, k, v)


def test_bad_fp8_input_raises_named_errors():
    q8, k8, v8, qd, kd, vd = _fp8_args()
    with pytest.raises(ValueError, match="missing: k_descale, v_descale"):
        flash_attn_func(q8, k8, v8, q_descale=qd)
    with pytest.raises(ValueError, match="missing: q_descale, k_descale, v_descale"):
        flash_attn_func(q8, k8, v8)
    with pytest.raises(ValueError, match=r"k_descale must be float32 of shape \(batch, nheads_k\) = \(1, 2\)"):
        flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd[:, :1], v_descale=vd)
    with pytest.raises(ValueError, match="v_descale must be float32"):
        flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd.double())
    with pytest.raises(TypeError, match="float8_e5m2"):
        flash_attn_func(q8, k8.to(torch.float8_e5m2), v8, q_descale=qd, k_descale=kd, v_descale=vd)
    with pytest.raises(TypeError, match="all in torch.float8_e4m3fn"):
        flash_attn_func(q8, k8, v8.float().to(torch.bfloat16), q_descale=qd, k_descale=kd, v_descale=vd)
    bf = q8.float().to(torch.bfloat16)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        flash_attn_func(bf, bf, bf, q_descale=qd, k_descale=kd, v_descale=vd)
    with pytest.raises(NotImplementedError, match="dropout"):
        flash_attn_func(q8, k8, v8, dropout_p=0.1, q_descale=qd, k_descale=kd, v_descale=vd)
    with pytest.raises(ValueError, match="head dims differ"):
        flash_attn_func(q8, k8[..., :16], v8, q_descale=qd, k_descale=kd, v_descale=vd)


def test_fp8_is_forward_only():
    q8, k8, v8, qd, kd, vd = _fp8_args()
    q8.requires_grad_()
    with pytest.raises(NotImplementedError, match="forward only"):
        flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    with torch.no_grad():
        out = flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    assert not out.requires_grad and torch.isfinite(out.float()).all()


def test_fp8_under_torch_compile():
    q8, k8, v8, qd, kd, vd = _fp8_args(batch=2)
    fn = torch.compile(lambda *a: flash_attn_func(*a[:3], causal=True, q_descale=a[3], k_descale=a[4],
                                                  v_descale=a[5]), fullgraph=True,
                       backend="inductor" if ON_GPU else "aot_eager")
    out = fn(q8, k8, v8, qd, kd, vd)
    eager = flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    assert torch.equal(out, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("outliers", [False, True])
def test_fp8_error_on_original_inputs(outliers):
    """Against float64 on the bf16 originals (quantisation error included): within 2x PyTorch's FP8 baseline on
    the same quantised inputs. The bf16 kernel's error, next to it, is the benchmark's report."""
    q, k, v = _inputs(1, 2048, 2048, 8, 8, 128, outliers, seed=9)
    ref, _ = attention_fp8_ref(q, k, v, *(torch.ones(1, 8, device=DEVICE),) * 3, causal=True)
    q8, k8, v8, qd, kd, vd = quantize_fp8(q, k, v)
    ours = flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    pt, _ = attention_fp8_ref(q8, k8, v8, qd, kd, vd, causal=True, upcast=False)
    assert_close_to_ref("out vs bf16 originals", ours, ref, pt, FWD_FACTOR)


def _quantize_like(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """x (batch, seqlen, nheads_k, dim) in e4m3 with given (batch, nheads_k) descales (appended rows must share
    the cache's scale)."""
    return (x.float() / descale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("paged,num_splits", [(False, 0), (False, 3), (True, 1)])
def test_fp8_kvcache_with_append(paged, num_splits):
    from flashattn2 import flash_attn_with_kvcache

    torch.manual_seed(7)
    batch, new, nheads, nheads_k, dim, capacity, page = 2, 2, 4, 2, 64, 48, 8
    q, k_full, v_full = _inputs(batch, new, capacity, nheads, nheads_k, dim, seed=21)
    q8, k_cache, v_cache, qd, kd, vd = quantize_fp8(q, k_full, v_full)
    k_new, v_new = (_quantize_like(randn(batch, new, nheads_k, dim, dtype=torch.bfloat16), d) for d in (kd, vd))
    seqlens = torch.tensor([20, 37], dtype=torch.int32, device=DEVICE)
    block_table = None
    if paged:  # the same rows in shuffled pages of a pool
        pages = capacity // page
        perm = torch.randperm(batch * pages, device=DEVICE)
        block_table = perm.view(batch, pages).to(torch.int32)
        pool = [torch.empty(batch * pages, page, nheads_k, dim, dtype=torch.uint8, device=DEVICE) for _ in range(2)]
        for x, p in zip((k_cache, v_cache), pool, strict=True):
            p[perm] = x.view(torch.uint8).reshape(batch * pages, page, nheads_k, dim)
        k_cache, v_cache = (p.view(torch.float8_e4m3fn) for p in pool)
    out, lse = flash_attn_with_kvcache(q8, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=seqlens, causal=True,
                                       block_table=block_table, num_splits=num_splits, return_softmax_lse=True,
                                       q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    for b in range(batch):
        if paged:
            logical = [c.view(torch.uint8)[block_table[b].long()].reshape(capacity, nheads_k, dim)
                       .view(torch.float8_e4m3fn)[None] for c in (k_cache, v_cache)]
        else:
            logical = [c[b:b + 1] for c in (k_cache, v_cache)]
        end = int(seqlens[b]) + new
        for c, x in zip(logical, (k_new, v_new), strict=True):  # appended bit for bit
            assert torch.equal(c[0, end - new:end].view(torch.uint8), x[b].view(torch.uint8))
        keys, values = (c[:, :end] for c in logical)
        args = (q8[b:b + 1], keys, values, qd[b:b + 1], kd[b:b + 1], vd[b:b + 1])
        ref, ref_lse = attention_fp8_ref(*args, causal=True)
        pt, _ = attention_fp8_ref(*args, causal=True, upcast=False)
        assert_close_to_ref(f"out[{b}]", out[b:b + 1], ref, pt, FWD_FACTOR)
        torch.testing.assert_close(lse[b:b + 1].double(), ref_lse, rtol=1e-4, atol=1e-4)


def test_fp8_kvcache_bad_input():
    from flashattn2 import flash_attn_with_kvcache

    q8, k8, v8, qd, kd, vd = _fp8_args()
    with pytest.raises(ValueError, match="missing: v_descale"):
        flash_attn_with_kvcache(q8, k8, v8, q_descale=qd, k_descale=kd)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        flash_attn_with_kvcache(q8, k8.float().to(torch.bfloat16), v8, q_descale=qd, k_descale=kd, v_descale=vd)
    cos = torch.ones(16, 8, device=DEVICE)
    with pytest.raises(NotImplementedError, match="rotary"):
        flash_attn_with_kvcache(q8, k8, v8, k=k8[:, :1], v=v8[:, :1], cache_seqlens=4, rotary_cos=cos,
                                rotary_sin=cos, q_descale=qd, k_descale=kd, v_descale=vd)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="sync debug mode needs a GPU")
@pytest.mark.parametrize("backend", ["auto", "gluon", "triton"])  # auto sends short causal FP8 calls to Triton
def test_fp8_calls_do_not_sync(backend):
    import flashattn2
    from flashattn2 import flash_attn_with_kvcache
    from flashattn2.kernels.backends import get_backend

    q, k, v = _inputs(2, 300, 300, 8, 2, 128, seed=3)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32, device=DEVICE)
    cache_seqlens = torch.tensor([50, 120], dtype=torch.int32, device=DEVICE)

    def calls():
        q8, k8, v8, qd, kd, vd = quantize_fp8(q, k, v)
        flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
        p8 = quantize_fp8(q[0], k[0], v[0], cu, cu)
        flash_attn_varlen_func(*p8[:3], cu, cu, 200, 200, causal=True, q_descale=p8[3], k_descale=p8[4],
                               v_descale=p8[5])
        flash_attn_with_kvcache(q8[:, :1], k8, v8, cache_seqlens=cache_seqlens, causal=True, q_descale=qd,
                                k_descale=kd, v_descale=vd)

    before = get_backend()
    flashattn2.set_backend(backend)
    try:
        calls()  # the first calls compile; later ones are the steady state
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            calls()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
    finally:
        flashattn2.set_backend(before)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("varlen", [False, True])
def test_fp8_calls_replay_in_a_cuda_graph(backend, varlen):
    # serving captures inference calls: V's copy, the descales and the kernel must replay on new inputs
    import flashattn2
    from flashattn2.kernels.backends import get_backend

    cu = torch.tensor([0, 100, 100, 333], dtype=torch.int32, device=DEVICE)

    def fresh(seed):
        q, k, v = _inputs(1 if varlen else 2, 333, 333, 4, 2, 128, seed=seed)
        if varlen:
            return quantize_fp8(q[0], k[0], v[0], cu, cu)
        return quantize_fp8(q, k, v)

    def call(q8, k8, v8, qd, kd, vd):
        if varlen:
            return flash_attn_varlen_func(q8, k8, v8, cu, cu, 233, 233, causal=True, q_descale=qd, k_descale=kd,
                                          v_descale=vd)
        return flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)

    before = get_backend()
    flashattn2.set_backend(backend)
    try:
        static = [x.clone() for x in fresh(0)]  # the graph's input buffers
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                call(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = call(*static)
        outs = []
        for seed in (1, 2):
            inputs = fresh(seed)
            for buf, x in zip(static, inputs, strict=True):
                buf.copy_(x)
            graph.replay()
            eager = call(*inputs)
            assert not eager.isnan().any()
            assert torch.equal(static_out, eager)
            outs.append(static_out.clone())
        assert not torch.equal(outs[0], outs[1])  # the replays did see the new inputs
    finally:
        flashattn2.set_backend(before)
