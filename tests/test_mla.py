"""A value head dim unlike the query/key head dim (DeepSeek's MLA: 192/128; and 96/64), issue 27 deliverable 2:
flash_attn_func and flash_attn_varlen_func forward and backward against the float64 reference by flash_attn's
rule; out takes v's head dim and the default scale stays 1/sqrt(query head dim). On the CPU interpreter and the
GPU (the Hopper kernels decline such calls: the portable kernels run them)."""

import os

import pytest
import torch

import flashattn2
from flashattn2.kernels.backends import backward_backend, forward_backend
from flashattn2.kernels.params import AttnOptions
from flashattn2.reference import attention_ref
from helpers import (
    BWD_FACTOR,
    DEVICE,
    FWD_FACTOR,
    assert_close_to_ref,
    packed_sequences,
    randn,
    reference_with_grads,
)

DIMS = [(192, 128), (96, 64)]


@pytest.mark.parametrize("head_dim,head_dim_v", DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_dense_unlike_value_head_dim(head_dim, head_dim_v, causal):
    torch.manual_seed(0)
    batch, seqlen_q, seqlen_k, heads, heads_k = 2, 70, 90, 4, 2
    q = randn(batch, seqlen_q, heads, head_dim, dtype=torch.bfloat16, requires_grad=True)
    k = randn(batch, seqlen_k, heads_k, head_dim, dtype=torch.bfloat16, requires_grad=True)
    v = randn(batch, seqlen_k, heads_k, head_dim_v, dtype=torch.bfloat16, requires_grad=True)
    out, lse, _ = flashattn2.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == (batch, seqlen_q, heads, head_dim_v)
    dout = randn(*out.shape, dtype=out.dtype)
    out.backward(dout)
    ref, ref_lse, ref_grads = reference_with_grads(q, k, v, dout, causal=causal)
    pt, _, pt_grads = reference_with_grads(q, k, v, dout, upcast=False, causal=causal)
    assert_close_to_ref("out", out, ref, pt, FWD_FACTOR)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-4, atol=1e-4)  # scale: 1/sqrt(query head dim)
    for name, x, r, p in zip(("dq", "dk", "dv"), (q, k, v), ref_grads, pt_grads, strict=True):
        assert_close_to_ref(name, x.grad, r, p, BWD_FACTOR)


def test_varlen_unlike_value_head_dim_with_a_sink():
    # packed sequences (one empty), GQA, causal, and an attention sink on top
    torch.manual_seed(1)
    lens_q, lens_k, heads, heads_k, head_dim, head_dim_v = [33, 0, 48], [40, 12, 48], 4, 1, 96, 64
    cu_q, cu_k = (torch.tensor([0] + lens, device=DEVICE).cumsum(0).to(torch.int32) for lens in (lens_q, lens_k))
    q = randn(sum(lens_q), heads, head_dim, dtype=torch.float16, requires_grad=True)
    k = randn(sum(lens_k), heads_k, head_dim, dtype=torch.float16, requires_grad=True)
    v = randn(sum(lens_k), heads_k, head_dim_v, dtype=torch.float16, requires_grad=True)
    sink = torch.randn(heads, device=DEVICE)
    out = flashattn2.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                            learnable_sink=sink)
    assert out.shape == (sum(lens_q), heads, head_dim_v)
    dout = randn(*out.shape, dtype=out.dtype)
    out.backward(dout)
    for sq, sk, seq in packed_sequences(q, k, v, cu_q, cu_k, lens_q, lens_k):
        kw = dict(causal=True, learnable_sink=sink)
        ref, _, ref_grads = reference_with_grads(*seq, dout[sq][None], **kw)
        pt, _, pt_grads = reference_with_grads(*seq, dout[sq][None], upcast=False,
                                               **dict(kw, learnable_sink=sink.half()))
        assert_close_to_ref("out", out[sq][None], ref, pt, FWD_FACTOR)
        mine = (q.grad[sq][None], k.grad[sk][None], v.grad[sk][None])
        for name, g, r, p in zip(("dq", "dk", "dv"), mine, ref_grads, pt_grads, strict=True):
            assert_close_to_ref(name, g, r, p, BWD_FACTOR)


def test_the_hopper_kernels_take_192_128_only_and_errors_name_the_problem():
    q, k = (randn(1, 64, 2, 192, dtype=torch.bfloat16) for _ in range(2))
    v = randn(1, 64, 2, 128, dtype=torch.bfloat16)
    opts = AttnOptions(softmax_scale=192 ** -0.5)
    for choose in (lambda v: forward_backend(q, k, v, opts), lambda v: backward_backend(v, q, k, v, opts)):
        backend, why = choose(v)  # 192/128: the Gluon kernels (on Hopper, where chosen)
        assert (backend == "gluon-sm90") == (why is None)
        backend, why = choose(randn(1, 64, 2, 96, dtype=torch.bfloat16))  # other pairs: the portable kernels
        assert backend == "triton" and why is not None
    with pytest.raises(ValueError, match="head dims differ"):
        flashattn2.flash_attn_func(q, randn(1, 64, 2, 128, dtype=torch.bfloat16), v)
    with pytest.raises(ValueError, match="v's head dim"):
        flashattn2.flash_attn_func(q, k, randn(1, 64, 2, 320, dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.skipif(not (DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)),
                    reason="needs an sm_90 GPU (the Gluon forward)")
@pytest.mark.parametrize("causal,varlen,deterministic,long,mha", [
    (False, False, False, False, False), (True, False, False, False, False), (True, True, False, False, False),
    (True, False, True, False, False), (True, False, False, True, False), (False, False, False, True, False),
    (True, False, False, False, True)])
@pytest.mark.parametrize("items", ["64-key", "128-key", "128-key-consumers-add-dq",
                                   "128-key-one-slot-unpaired-plain-stores"])
def test_gluon_unlike_value_head_dim(causal, varlen, deterministic, long, mha, items, monkeypatch):
    # the Hopper forward and backward at 192/128 (Q and K in 64-column tiles): cut query and key tiles, GQA, packed
    # sequences, the deterministic backward (dK/dV kernel, dQ from the Triton kernel); long: more work items than
    # SMs, so that programs of the persistent grids take several; mha: one query head a kv head (DeepSeek's MLA
    # trains so), where a work item's step count takes either parity; the backward's 128-key items (CONFIGS_MLA) and
    # the 64-key ones kept to compare (CONFIGS_MLA_NARROW); the dQ reduce-adds issued by the producer warpgroup
    # (DQ_WRITER, CONFIGS_MLA's) or by the consumers, warpgroup 0's with its dQ chunks through one staging buffer or
    # two, their matmuls in flight together (DQ_PAIR) or one at a time, dK/dV out through shared memory
    # (COALESCED_DKV) or with plain stores from the accumulators
    from flashattn2.kernels.sm90 import backward as bwd_sm90

    if items == "64-key":
        monkeypatch.setattr(bwd_sm90, "CONFIGS_MLA", bwd_sm90.CONFIGS_MLA_NARROW)
    elif items != "128-key":  # without the writer: the other keys as CONFIGS_MLA has them, or all the other way
        other = items != "128-key-consumers-add-dq"
        monkeypatch.setattr(bwd_sm90, "CONFIGS_MLA", {
            dims: dict(config, DQ_WRITER=False, DQ_SPARE_SLOT=config["DQ_SPARE_SLOT"] ^ other,
                       DQ_PAIR=config["DQ_PAIR"] ^ other, COALESCED_DKV=config["COALESCED_DKV"] ^ other)
            for dims, config in bwd_sm90.CONFIGS_MLA.items()})
    torch.manual_seed(3)
    flashattn2.set_backend("gluon")  # drops plans made with the other tuning
    try:
        heads, heads_k = (16, 8) if long else ((3, 3) if mha else (4, 2))
        if varlen:
            lens = [200, 0, 333]
            cu = torch.tensor([0] + lens, device=DEVICE).cumsum(0).to(torch.int32)
            q, k = (randn(sum(lens), h, 192, dtype=torch.bfloat16, requires_grad=True) for h in (heads, heads_k))
            v = randn(sum(lens), heads_k, 128, dtype=torch.bfloat16, requires_grad=True)
            packed = AttnOptions(softmax_scale=192 ** -0.5, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=333,
                                 max_seqlen_k=333)
            assert forward_backend(q, k, v, packed)[0] == "gluon-sm90"
            assert backward_backend(v, q, k, v, packed)[0] == "gluon-sm90"
            out = flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
            dout = randn(*out.shape, dtype=out.dtype)
            out.backward(dout)
            for sq, sk, seq in packed_sequences(q, k, v, cu, cu, lens, lens):
                ref, _, ref_grads = reference_with_grads(*seq, dout[sq][None], causal=causal)
                pt, _, pt_grads = reference_with_grads(*seq, dout[sq][None], upcast=False, causal=causal)
                assert_close_to_ref("out", out[sq][None], ref, pt, FWD_FACTOR)
                mine = (q.grad[sq][None], k.grad[sk][None], v.grad[sk][None])
                for name, g, r, p in zip(("dq", "dk", "dv"), mine, ref_grads, pt_grads, strict=True):
                    assert_close_to_ref(name, g, r, p, BWD_FACTOR)
            return
        batch, seqlen_q, seqlen_k = (1, 2048, 2100) if long else (2, 300, 450)
        q = randn(batch, seqlen_q, heads, 192, dtype=torch.bfloat16, requires_grad=True)
        k = randn(batch, seqlen_k, heads_k, 192, dtype=torch.bfloat16, requires_grad=True)
        v = randn(batch, seqlen_k, heads_k, 128, dtype=torch.bfloat16, requires_grad=True)
        opts = AttnOptions(softmax_scale=192 ** -0.5, deterministic=deterministic)
        assert forward_backend(q, k, v, opts)[0] == "gluon-sm90"
        assert backward_backend(randn(*q.shape[:3], 128, dtype=v.dtype), q, k, v, opts)[0] == "gluon-sm90"
        out, lse, _ = flashattn2.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True,
                                                 deterministic=deterministic)
        dout = randn(*out.shape, dtype=out.dtype)
        out.backward(dout)
        ref, ref_lse, ref_grads = reference_with_grads(q, k, v, dout, causal=causal)
        pt, _, pt_grads = reference_with_grads(q, k, v, dout, upcast=False, causal=causal)
        assert_close_to_ref("out", out, ref, pt, FWD_FACTOR)
        torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-4, atol=1e-4)
        for name, x, r, p in zip(("dq", "dk", "dv"), (q, k, v), ref_grads, pt_grads, strict=True):
            assert_close_to_ref(name, x.grad, r, p, BWD_FACTOR)
    finally:
        flashattn2.set_backend(os.environ.get("FLASHATTN2_BACKEND", "auto"))


_COMPILE = """
import sys
sys.path.insert(0, sys.argv[1])
import ptx_snapshot as ps
from flashattn2.kernels.portable import backward, combine, forward, kvcache

mla = dict(ps.PLAIN, HEAD_DIM=192, BLOCK_D=256, HEAD_DIM_V=128, BLOCK_DV=128)
ps.triton_ptx(forward.attention_fwd_kernel, dict(mla, BLOCK_M=64, BLOCK_N=32, HAS_RIGHT=True), 4, 2,
              unused=("CuSeqlensQ", "CuSeqlensK", "AlibiSlopes", "Seed", "QDescale", "KDescale", "VDescale"))
ps.triton_ptx(backward.attention_bwd_dkdv_kernel, dict(mla, BLOCK_M=32, BLOCK_N=64, ATOMIC_DQ=True, TMA_DQ=False),
              4, 2, unused=("CuSeqlensQ", "CuSeqlensK", "AlibiSlopes", "Seed"))
# the forward with its sinks folded in (a float32 and a bf16 sink)
for sink_type in ("*fp32", "*bf16"):
    ps.triton_ptx(forward.attention_fwd_kernel, dict(ps.PLAIN, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=128, BLOCK_N=64,
                                                     HAS_RIGHT=True), 8, 2,
                  types={"Sink": sink_type},
                  unused=("CuSeqlensQ", "CuSeqlensK", "AlibiSlopes", "Seed", "QDescale", "KDescale", "VDescale"))
# the KV-cache kernel folding a sink in (one split), and the merge of splits taking it as one more part
kv = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_M=16, BLOCK_N=64, G=4, G_PAD=4, NUM_SPLITS=1, HAS_LEFT=False,
          HAS_RIGHT=True, IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_SEQLENS=True, HAS_LEFTPAD=False,
          HAS_BATCH_IDX=False, PAGED=True, INTERPRET=False)
ps.triton_ptx(kvcache.kvcache_attention_kernel, kv, 4, 2,
              {"stride_o": ("i32",) * 4, "stride_lse": ("i32",) * 4, "Sink": "*fp32"},
              ("CacheLeftpad", "CacheBatchIdx", "CuSeqlensQ", "AlibiSlopes", "QDescale", "KDescale", "VDescale"))
# MLA's latent cache: 64 query heads a tile, Q K^T as 512 + 64 columns with the value tile read from the key tile
ps.triton_ptx(kvcache.kvcache_attention_kernel, dict(kv, HEAD_DIM=576, BLOCK_D=64, HEAD_DIM_V=512, BLOCK_DV=512,
                                                     D_TAIL=64, V_IS_K=True, BLOCK_M=64, BLOCK_N=32, G=64, G_PAD=64),
              8, 2, {"stride_o": ("i32",) * 4, "stride_lse": ("i32",) * 4},
              ("CacheLeftpad", "CacheBatchIdx", "CuSeqlensQ", "AlibiSlopes", "QDescale", "KDescale", "VDescale"))
# equal query and value head dims past 256: Q K^T over 64-column chunks
ps.triton_ptx(kvcache.kvcache_attention_kernel, dict(kv, HEAD_DIM=320, BLOCK_D=64, D_CHUNK=64, HEAD_DIM_V=320,
                                                     BLOCK_DV=512, BLOCK_N=32, G=1, G_PAD=1), 8, 2,
              {"stride_o": ("i32",) * 4, "stride_lse": ("i32",) * 4},
              ("CacheLeftpad", "CacheBatchIdx", "CuSeqlensQ", "AlibiSlopes", "QDescale", "KDescale", "VDescale"))
ps.triton_ptx(combine.combine_kernel, dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_R=16, INTERPRET=False), 4, 1,
              {"OutP": "*fp32", "LseP": "*fp32", "Lse": "*fp32", "Sink": "*bf16", "stride_out_part": ("i32",) * 4,
               "stride_lse_part": ("i32",) * 4, "stride_out": ("i32",) * 3, "stride_lse": ("i32",) * 3,
               "empty_lse": "fp32"})
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="compile-only check for CPU CI; the GPU runs the kernels")
def test_mla_and_sink_kernels_compile_for_sm90(compile_child):
    # the interpreter runs Python, not Triton's compiler: the unlike-head-dim variants and the sink passes must
    # compile for sm_90 too
    run = compile_child.run(_COMPILE, [os.path.join(os.path.dirname(__file__), "..", "scripts")])
    assert run.returncode == 0, run.stderr[-4000:]


@pytest.mark.parametrize("paged,view,num_splits,heads", [(False, True, 1, 16), (False, False, 3, 16),
                                                         (True, True, 0, 16), (True, False, 2, 16),
                                                         (False, True, 0, 128), (True, True, 2, 128)])
def test_latent_cache_decoding(paged, view, num_splits, heads):
    # MLA decoding over one latent cache: query/key head dim 576, value 512 (the value cache a view of the key
    # cache's first 512 channels, or a tensor of its own), one KV head for 16 or 128 query heads (more than a tile
    # holds: the heads are packed in tiles of a divisor of the group), one or two new query rows per sequence
    # (causal), dense or paged (page 16), with or without splits of the keys
    torch.manual_seed(21)
    batch, capacity, lens = 2, 96, [37, 90]
    q = randn(batch, 2, heads, 576, dtype=torch.bfloat16)
    k_cache = randn(batch, capacity, 1, 576, dtype=torch.bfloat16)
    v_cache = k_cache[..., :512] if view else randn(batch, capacity, 1, 512, dtype=torch.bfloat16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    kwargs = dict(cache_seqlens=seqlens, causal=True, num_splits=num_splits, return_softmax_lse=True)
    if paged:
        page = 16
        table = torch.randperm(batch * capacity // page, device=DEVICE).to(torch.int32).view(batch, -1)
        pages = [torch.empty(batch * capacity // page, page, 1, 576, dtype=torch.bfloat16, device=DEVICE)]
        pages[0][table.flatten().long()] = k_cache.reshape(-1, page, 1, 576)
        pages.append(pages[0][..., :512] if view else torch.empty(pages[0].shape[:-1] + (512,), dtype=torch.bfloat16,
                                                                   device=DEVICE))
        if not view:
            pages[1][table.flatten().long()] = v_cache.reshape(-1, page, 1, 512)
        out, lse = flashattn2.flash_attn_with_kvcache(q, *pages, block_table=table, **kwargs)
    else:
        out, lse = flashattn2.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
    assert out.shape == (batch, 2, heads, 512)
    for b, n in enumerate(lens):
        seq = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
        ref, ref_lse = attention_ref(*seq, causal=True)
        pt, _ = attention_ref(*seq, causal=True, upcast=False)
        assert_close_to_ref("out", out[b:b + 1], ref, pt, FWD_FACTOR)
        torch.testing.assert_close(lse[b:b + 1].double(), ref_lse, rtol=1e-4, atol=1e-4)


def test_latent_cache_errors_name_the_problem():
    q = randn(1, 1, 4, 576, dtype=torch.bfloat16)
    k_cache = randn(1, 32, 1, 576, dtype=torch.bfloat16)
    seqlens = torch.tensor([20], dtype=torch.int32, device=DEVICE)
    with pytest.raises(NotImplementedError, match="appended"):
        flashattn2.flash_attn_with_kvcache(q, k_cache, k_cache[..., :512], k=randn(1, 1, 1, 576, dtype=torch.bfloat16),
                                           v=randn(1, 1, 1, 512, dtype=torch.bfloat16), cache_seqlens=seqlens)
    with pytest.raises(ValueError, match="v_cache's head dim"):
        flashattn2.flash_attn_with_kvcache(q[..., :256], k_cache[..., :256], randn(1, 32, 1, 320,
                                                                                   dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="multiple of 64"):
        flashattn2.flash_attn_with_kvcache(randn(1, 1, 4, 520, dtype=torch.bfloat16),
                                           randn(1, 32, 1, 520, dtype=torch.bfloat16),
                                           randn(1, 32, 1, 512, dtype=torch.bfloat16), cache_seqlens=seqlens)


_COMPILE_LATENT = """
import re
import torch
from flashattn2.kernels.sm90.latent import LATENT_TUNING, compile_for_sm90, launch_registers
for flags in (dict(), dict(NUM_SPLITS=4, HAS_SEQLENS=True, HAS_BATCH_IDX=True),
              dict(PAGED=True, HAS_SEQLENS=True, HAS_RIGHT=True, NUM_SPLITS=8), dict(VALUE_WGS=2, PAGED=True),
              dict(EARLY_LOAD=False, PAGED=True, HAS_SEQLENS=True, NUM_SPLITS=2),
              dict(VALUE_WGS=2, SCORE_WGS=2, PAGED=True, HAS_SEQLENS=True, HAS_RIGHT=True, NUM_SPLITS=2),
              dict(SEESAW=1, PAGED=True, HAS_SEQLENS=True, HAS_RIGHT=True, NUM_SPLITS=2),
              dict(SEESAW=1, NUM_SPLITS=4, HAS_SEQLENS=True, HAS_BATCH_IDX=True),
              dict(SEESAW=1, READY_PARTS=3, PAGED=True, HAS_SEQLENS=True, NUM_SPLITS=2),
              dict(SEESAW=1, READY_PARTS=2, EARLY_FREE=1, PAGED=True, HAS_SEQLENS=True, HAS_RIGHT=True)):
    kernel = compile_for_sm90(torch.bfloat16, **flags)
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx, flags
    # the launch needs warps x 32 x the register cap within the SM's 64K registers (else: out of resources)
    # (without .maxnreg, under free_registers: the launch's cap, each partition its setmaxnreg)
    cap, free = launch_registers(dict(LATENT_TUNING, **flags))
    found = re.search(r"\\.maxnreg (\\d+)", ptx)
    assert (found is None) == free, flags
    regs = cap if free else int(found.group(1))
    assert kernel.metadata.num_warps * 32 * regs <= 65536, (kernel.metadata.num_warps, regs)
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="compile-only check for CPU CI; the GPU runs the kernels")
def test_gluon_latent_decoding_compiles_for_sm90(compile_child):
    run = compile_child.run(_COMPILE_LATENT, [])
    assert run.returncode == 0, run.stderr[-4000:]


def test_latent_launch_registers():
    # the launch's register cap by tuning: four value warpgroups 96, two 168; two scores warpgroups (16 warps) the
    # cap 128 with free_registers, and only beside two value warpgroups
    from flashattn2.kernels import backends

    if not backends.GLUON_AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    from flashattn2.kernels.sm90.latent import LATENT_TUNING, launch_registers

    assert launch_registers(LATENT_TUNING) == (96, False) and LATENT_TUNING["SCORE_WGS"] == 1
    assert launch_registers(dict(LATENT_TUNING, VALUE_WGS=2)) == (168, False)
    assert launch_registers(dict(LATENT_TUNING, VALUE_WGS=2, SCORE_WGS=2)) == (128, True)
    with pytest.raises(ValueError, match="SCORE_WGS=2 runs with VALUE_WGS=2"):
        launch_registers(dict(LATENT_TUNING, SCORE_WGS=2))
    # the seesaw: a loader warp and two consumer warpgroups, 12 warps as launched, whatever SCORE_WGS / VALUE_WGS say
    assert LATENT_TUNING["SEESAW"] == 0
    assert launch_registers(dict(LATENT_TUNING, SEESAW=1)) == (168, True)
    assert launch_registers(dict(LATENT_TUNING, SEESAW=1, SCORE_WGS=2)) == (168, True)


def test_latent_seesaw_by_keys_per_program(monkeypatch):
    # host-side rule (static shapes, no sync): from SPLIT_SCORES_FROM keys a program the seesaw, dense or paged,
    # where it measured faster than two scores warpgroups (benchmarks/NOTES.md, seventeenth and eighteenth sessions)
    # and than one (at every length: thirty-first session)
    from flashattn2.kernels import backends

    if not backends.GLUON_AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    from flashattn2.kernels.sm90.latent import LATENT_TUNING, tuning_for

    assert LATENT_TUNING["SPLIT_SCORES_FROM"] == 0 and LATENT_TUNING["SEESAW_LONG"]
    for capacity, splits, long in ((4096, 1, True), (65536, 8, True), (16384, 8, True), (65536, 66, True),
                                   (4096, 32, True), (64, 1, True)):
        tuning = tuning_for(capacity, splits)
        assert "SPLIT_SCORES_FROM" not in tuning and "SEESAW_LONG" not in tuning  # host keys, not the kernel's
        expected = (1, 4, 1, 2, 1) if long else (1, 4, 0, 1, 0)  # READY_PARTS / EARLY_FREE: the seesaw's alone
        assert (tuning["SCORE_WGS"], tuning["VALUE_WGS"], tuning["SEESAW"], tuning["READY_PARTS"],
                tuning["EARLY_FREE"]) == expected, (capacity, splits)
    from flashattn2.kernels.sm90 import latent

    # below the threshold one scores warpgroup (the non-seesaw schedules run only where a tuning asks for them)
    monkeypatch.setattr(latent, "LATENT_TUNING", dict(LATENT_TUNING, SPLIT_SCORES_FROM=4096))
    assert latent.tuning_for(4095, 1)["SEESAW"] == 0 and latent.tuning_for(16384, 8)["SEESAW"] == 0
    assert latent.tuning_for(4096, 1)["SEESAW"] == 1
    assert latent.tuning_for(None)["SEESAW"] == 0  # LATENT_TUNING's own schedule (CI's compile check)
    monkeypatch.setattr(latent, "LATENT_TUNING", dict(LATENT_TUNING, SEESAW_LONG=0))  # the rule's switch
    assert latent.tuning_for(65536, 1) == dict(VALUE_WGS=2, EARLY_LOAD=True, SCORE_WGS=2, SEESAW=0,
                                               READY_PARTS=1, EARLY_FREE=0)
    monkeypatch.setattr(latent, "LATENT_TUNING", dict(LATENT_TUNING, SEESAW=1))  # the seesaw keeps its schedule
    assert latent.tuning_for(65536, 1) == dict(VALUE_WGS=4, EARLY_LOAD=True, SCORE_WGS=1, SEESAW=1,
                                               READY_PARTS=2, EARLY_FREE=1)


def test_latent_decoding_over_an_empty_cache():
    # a cache with no key positions: the Gluon kernel declines it (a TMA descriptor takes no zero-sized dimension)
    # and the Triton kernel answers, under "gluon" too: out 0, lse +inf (no key)
    from flashattn2.kernels import backends

    if backends.GLUON_AVAILABLE:
        from flashattn2.kernels.sm90.latent import can_implement

        empty = torch.empty(1, 0, 1, 576, dtype=torch.bfloat16)
        assert "no keys" in can_implement(torch.empty(1, 1, 128, 576, dtype=torch.bfloat16), empty,
                                          empty[..., :512], None, None, None, AttnOptions(576 ** -0.5))
    q = randn(2, 1, 128, 576, dtype=torch.bfloat16)
    k_cache = randn(2, 0, 1, 576, dtype=torch.bfloat16)
    try:
        flashattn2.set_backend("gluon" if backends.GLUON_AVAILABLE else "auto")
        out, lse = flashattn2.flash_attn_with_kvcache(q, k_cache, k_cache[..., :512], return_softmax_lse=True)
    finally:
        flashattn2.set_backend(os.environ.get("FLASHATTN2_BACKEND", "auto"))
    assert out.shape == (2, 1, 128, 512) and not out.isnan().any() and (out == 0).all()
    assert (lse == float("inf")).all()


def test_auto_takes_the_gluon_latent_kernel(monkeypatch):
    # host-side rule, so it runs anywhere: "auto" and "gluon" hand flash_attn_with_kvcache the Gluon latent attend
    # ("triton" never), for every call the kernel can run: batch 1 with 4k keys too (H200, benchmarks/NOTES.md
    # session 32: its kernel time 1.1-1.8x Triton's at batch 1-4; eager, its host time now within a few µs)
    from flashattn2.kernels import backends
    from flashattn2.kernels.sm90 import latent

    if not backends.GLUON_AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    made = []
    monkeypatch.setattr(latent, "can_implement", lambda *args: None)  # as on an sm_90 GPU
    monkeypatch.setattr(latent, "LatentLaunch", lambda *args: made.append(args[0].shape[0]) or "gluon attend")
    q, cache = torch.empty(1, 1, 128, 576), torch.empty(1, 4096, 1, 576)
    opts = AttnOptions(softmax_scale=576 ** -0.5)
    try:
        for choice, expected in (("auto", True), ("gluon", True), ("triton", False)):
            flashattn2.set_backend(choice)
            hopper = backends.kvcache_hopper()
            assert (hopper is not None) == expected, choice
            if hopper is not None:
                assert hopper(q, cache, cache[..., :512], None, None, None, None, None, opts, 1, (), ()) == \
                    "gluon attend", choice
    finally:
        flashattn2.set_backend(os.environ.get("FLASHATTN2_BACKEND", "auto"))
    assert made == [1, 1]


@pytest.mark.gpu
@pytest.mark.skipif(not (DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)),
                    reason="needs an sm_90 GPU (the Gluon latent-decoding kernel)")
@pytest.mark.parametrize("paged,seqlen_q,num_splits,heads,batch_idx",
                         [(False, 1, 1, 128, False), (False, 2, 0, 128, False), (True, 2, 3, 64, False),
                          (True, 1, 0, 128, False), (False, 1, 2, 64, True)])
@pytest.mark.parametrize("value_wgs,early_load,score_wgs,seesaw,extra",
                         [(4, True, 1, 0, {}), (2, True, 1, 0, {}), (4, False, 1, 0, {}), (2, True, 2, 0, {}),
                          (4, True, 1, 1, dict(READY_PARTS=1, EARLY_FREE=0)),
                          (4, True, 1, 1, dict(READY_PARTS=3, EARLY_FREE=0)),
                          (4, True, 1, 1, dict(READY_PARTS=2, EARLY_FREE=1)),
                          (4, True, 1, 1, dict(READY_PARTS=9, EARLY_FREE=1))],
                         ids=["wgs4-early-load", "wgs2-early-load", "wgs4", "wgs2-two-scores", "seesaw-parts1",
                              "seesaw-parts3", "seesaw-parts2-early-free", "seesaw-parts9-early-free"])
def test_gluon_latent_decoding(paged, seqlen_q, num_splits, heads, batch_idx, value_wgs, early_load, score_wgs, seesaw,
                               extra, monkeypatch):
    # sm90/latent.py under FLASHATTN2_BACKEND=gluon: the cache's capacity past each sequence holds NaN (the kernel
    # zeroes those key rows before P V), lengths that cut tiles, one or two query rows (causal), splits, pages of
    # 64 keys, a cache_batch_idx; four value warpgroups of 128 columns and two of 256 (VALUE_WGS); the next tile's
    # load under the scores' wgmmas (EARLY_LOAD); two scores warpgroups on alternate tiles (SCORE_WGS); two
    # warpgroups each with half of O and the scores of every other tile, a loader warp (SEESAW), its tiles' loads
    # on several barriers each (READY_PARTS), their halves freed apart (EARLY_FREE)
    from flashattn2 import inference
    from flashattn2.kernels import backends
    from flashattn2.kernels.portable import kvcache
    from flashattn2.kernels.portable.kvcache import kvcache_plan
    from flashattn2.kernels.sm90 import latent

    # the other schedules run only below SPLIT_SCORES_FROM keys a program (the default takes the seesaw everywhere)
    monkeypatch.setattr(latent, "LATENT_TUNING", dict(latent.LATENT_TUNING, VALUE_WGS=value_wgs,
                                                      EARLY_LOAD=early_load, SCORE_WGS=score_wgs, SEESAW=seesaw,
                                                      SPLIT_SCORES_FROM=0 if seesaw else 1 << 30, **extra))
    inference._seen.clear()  # plans made under the other tuning
    kvcache._plans.clear()

    torch.manual_seed(23)
    # the seesaw takes tiles in pairs: 100 keys make a pair cut in its second tile (WG1 zeroes the rows), 180 a pair
    # and one tile cut (WG0 zeroes them); three splits give ranges of one tile and of none
    batch, capacity, lens = 2, 256, [100, 180] if seesaw else [37, 200]
    if extra.get("EARLY_FREE"):  # stages reused several times: a first half reloaded while WG1 still reads P_a
        capacity, lens = 768, [300, 700]
    q = randn(batch, seqlen_q, heads, 576, dtype=torch.bfloat16)
    k_cache = randn(batch, capacity, 1, 576, dtype=torch.bfloat16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    rows = torch.tensor([1, 0], dtype=torch.int32, device=DEVICE) if batch_idx else None
    source = [1, 0] if batch_idx else [0, 1]  # the cache row of each sequence
    for b, n in enumerate(lens):
        k_cache[source[b], n:] = float("nan")
    flashattn2.set_backend("gluon")
    try:
        kwargs = dict(cache_seqlens=seqlens, causal=True, num_splits=num_splits, return_softmax_lse=True,
                      cache_batch_idx=rows)
        if paged:
            page = 64
            table = torch.randperm(batch * capacity // page, device=DEVICE).to(torch.int32).view(batch, -1)
            pages = torch.full((batch * capacity // page, page, 1, 576), float("nan"), dtype=torch.bfloat16,
                               device=DEVICE)
            pages[table.flatten().long()] = k_cache.reshape(-1, page, 1, 576)
            caches, kwargs["block_table"] = (pages, pages[..., :512]), table
        else:
            caches = (k_cache, k_cache[..., :512])
        out, lse = flashattn2.flash_attn_with_kvcache(q, *caches, **kwargs)
        opts = AttnOptions(softmax_scale=576 ** -0.5, window_left=-1, window_right=0)
        plan = kvcache_plan(q, *caches, None, None, seqlens, None, rows, kwargs.get("block_table"), opts, num_splits,
                            backends.kvcache_hopper())
        assert plan.backend == "gluon-sm90" and plan.attend.launch.named["VALUE_WGS"] == value_wgs
        assert plan.attend.launch.named["EARLY_LOAD"] == early_load
        assert plan.attend.launch.named["SCORE_WGS"] == score_wgs
        assert plan.attend.launch.named["SEESAW"] == seesaw
    finally:
        flashattn2.set_backend(os.environ.get("FLASHATTN2_BACKEND", "auto"))
    assert out.shape == (batch, seqlen_q, heads, 512)
    for b, n in enumerate(lens):
        src = source[b]
        seq = (q[b:b + 1], k_cache[src:src + 1, :n], k_cache[src:src + 1, :n, :, :512])
        ref, ref_lse = attention_ref(*seq, causal=True)
        pt, _ = attention_ref(*seq, causal=True, upcast=False)
        assert_close_to_ref("out", out[b:b + 1], ref, pt, FWD_FACTOR)
        torch.testing.assert_close(lse[b:b + 1].double(), ref_lse, rtol=1e-4, atol=1e-4)
