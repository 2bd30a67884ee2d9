"""flash_attn_with_kvcache and the paged flash_attn_varlen_func against a float64 reference built from the
spec (not from our kernels): dense and paged caches of several page sizes, append, rotary, leftpad,
cache_batch_idx, GQA packing, split-KV, every score option; the cache contents after the append; bad
inputs. CPU under the interpreter, and the GPU (plus CUDA graphs and torch.compile there)."""

import math
import shutil
import zlib

import pytest
import torch

import flashattn2
from flashattn2 import apply_rotary_emb, attention_ref, flash_attn_varlen_func, flash_attn_with_kvcache
from flashattn2.kernels.portable import cu_seqlens as cu_checks
from helpers import DEVICE, ON_GPU, assert_close_to_ref, randn

# flash_attn's kvcache test: 3x PyTorch's error in the input dtype (5x with ALiBi)
FACTOR, ALIBI_FACTOR = 3.0, 5.0


def rotary_ref(x, cos, sin, positions, interleaved, upcast=False):
    """x (b, s, h, d) rotated at positions (b, s): in fp32 rounded once to x's dtype (the stored keys, and
    what a PyTorch model computes), or with upcast in float64, unrounded (the oracle's input)."""
    half = cos.shape[1]
    wide = torch.float64 if upcast else torch.float32
    c, s = cos.to(wide)[positions][:, :, None, :], sin.to(wide)[positions][:, :, None, :]
    x32 = x.to(wide)
    rot = x32[..., :2 * half]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else (rot[..., :half], rot[..., half:])
    o1, o2 = x1 * c - x2 * s, x1 * s + x2 * c
    out = torch.stack((o1, o2), -1).flatten(-2) if interleaved else torch.cat((o1, o2), -1)
    return torch.cat((out, x32[..., 2 * half:]), -1).to(wide if upcast else x.dtype)


def _logical_cache(cache, row, block_table):
    """The cache rows of one sequence in position order: a dense row, or its pages concatenated."""
    if block_table is None:
        return cache[row]
    return cache[block_table[row].long()].flatten(0, 1)


def kvcache_reference(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                      block_table, causal, window_size, softcap, interleaved, alibi_slopes, upcast):
    """(out, lse (b, h, s_q)), sequence by sequence, over keys [leftpad, cache_seqlens + s_new)."""
    batch, seqlen_q = q.shape[:2]
    s_new = 0 if k is None else k.shape[1]
    local = causal or window_size != (-1, -1)
    outs, lses = [], []
    for i in range(batch):
        row = i if cache_batch_idx is None else int(cache_batch_idx[i])
        length = int(cache_seqlens[i]) if cache_seqlens is not None else k_cache.shape[1]
        pad = 0 if cache_leftpad is None else int(cache_leftpad[i])
        keys = _logical_cache(k_cache, row, block_table)[pad:length]
        vals = _logical_cache(v_cache, row, block_table)[pad:length]
        qi = q[i:i + 1]
        if k is not None:
            ki = k[i:i + 1]
            if cos is not None:
                # the oracle rotates in float64; the input-dtype reference rounds like a PyTorch model
                pos = (length + torch.arange(s_new, device=q.device))[None]
                ki = rotary_ref(ki, cos, sin, pos, interleaved, upcast)
                qpos = (length + torch.arange(seqlen_q, device=q.device) * int(local))[None]
                qi = rotary_ref(qi, cos, sin, qpos, interleaved, upcast)
            keys, vals = torch.cat((keys.to(ki.dtype), ki[0])), torch.cat((vals, v[i]))
        alibi = None if alibi_slopes is None else (alibi_slopes[i] if alibi_slopes.dim() == 2 else alibi_slopes)
        out, lse = attention_ref(qi, keys[None], vals[None], causal=causal, window_size=window_size, softcap=softcap,
                                 alibi_slopes=alibi, upcast=upcast)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _pages(k_dense, page_size, generator):
    """A paged copy of dense caches (b, capacity, h, d): pages in a shuffled pool with spare pages."""
    batch, capacity = k_dense.shape[:2]
    per_seq = math.ceil(capacity / page_size)
    num_blocks = batch * per_seq + 3
    perm = torch.randperm(num_blocks, generator=generator)[:batch * per_seq].to(k_dense.device)
    table = perm.view(batch, per_seq).to(torch.int32)
    pool = torch.randn(num_blocks, page_size, *k_dense.shape[2:], device=k_dense.device).to(k_dense.dtype)
    padded = torch.nn.functional.pad(k_dense, (0, 0, 0, 0, 0, per_seq * page_size - capacity))
    pool[table.long()] = padded.view(batch, per_seq, page_size, *k_dense.shape[2:])
    return pool, table


CASES = {
    # name: (batch, seqlen_q, s_new, nheads, nheads_k, head_dim, capacity, options)
    "decode": (2, 1, 0, 4, 4, 64, 40, {}),
    "decode_gqa_append": (3, 1, 1, 4, 2, 64, 48, dict(causal=True)),
    "rotary_paged_causal_gqa": (2, 1, 1, 4, 1, 64, 48, dict(causal=True, rotary=32, page=5)),
    "rotary_not_interleaved_noncausal": (2, 3, 2, 2, 2, 32, 40, dict(rotary=16, interleaved=False)),
    "leftpad": (3, 2, 2, 2, 1, 32, 40, dict(causal=True, leftpad=True)),
    "leftpad_paged": (2, 1, 1, 2, 2, 32, 40, dict(leftpad=True, page=16)),
    "batch_idx": (2, 1, 1, 2, 2, 32, 40, dict(batch_idx=True, causal=True)),
    "batch_idx_paged": (2, 1, 1, 2, 2, 32, 40, dict(batch_idx=True, page=5)),
    "window_softcap_alibi": (2, 4, 4, 4, 2, 64, 48, dict(window=(9, 0), softcap=8.0, alibi=True)),
    "seqlens_zero": (3, 1, 0, 2, 2, 32, 32, dict(zero=True)),
    "speculative_s_q_gt_1": (2, 5, 5, 4, 2, 64, 48, dict(causal=True, rotary=32, page=1)),
    "no_pack_long_prefill": (1, 70, 70, 4, 2, 32, 96, dict(causal=True)),
    "page_256": (2, 1, 1, 2, 1, 32, 300, dict(page=256, causal=True)),
    "full_capacity": (2, 3, 0, 2, 2, 32, 24, dict(no_seqlens=True, causal=True)),
    "int_seqlens": (2, 1, 1, 2, 2, 32, 24, dict(int_seqlens=True)),
    "head_dim_100": (2, 1, 1, 2, 2, 100, 24, dict(rotary=32)),
    # a GQA group wider than the largest tile is not packed (the interpreter's tile holds 16 rows)
    "mqa_wide_group": (1, 1, 1, 32, 1, 32, 33, dict(causal=True)),  # 33 keys: the last opens a tile
}


def _make_case(name, dtype, seed=0):
    batch, seqlen_q, s_new, nheads, nheads_k, head_dim, capacity, o = CASES[name]
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    cache_rows = batch + 2 if o.get("batch_idx") else batch
    k_dense = randn(cache_rows, capacity, nheads_k, head_dim, dtype=dtype)
    v_dense = randn(cache_rows, capacity, nheads_k, head_dim, dtype=dtype)
    k = v = cos = sin = None
    if s_new:
        k = randn(batch, s_new, nheads_k, head_dim, dtype=dtype)
        v = randn(batch, s_new, nheads_k, head_dim, dtype=dtype)
    lengths = torch.randint(0, capacity - s_new + 1, (batch,), generator=g)
    lengths[0] = capacity - s_new  # one sequence fills the cache exactly
    if o.get("zero"):
        lengths[1] = 0
    cache_seqlens = lengths.to(torch.int32).to(DEVICE)
    leftpad = batch_idx = None
    if o.get("leftpad"):
        leftpad = torch.stack([torch.randint(0, int(n) + 1, (1,), generator=g)[0] for n in lengths]).to(torch.int32)
        leftpad = leftpad.to(DEVICE)
    if o.get("batch_idx"):
        batch_idx = torch.randperm(cache_rows, generator=g)[:batch].to(torch.int32).to(DEVICE)
    if o.get("rotary"):
        rd = o["rotary"]
        angle = torch.rand(capacity + 5, rd // 2, generator=g) * 2 * math.pi
        cos, sin = torch.cos(angle).to(dtype).to(DEVICE), torch.sin(angle).to(dtype).to(DEVICE)
    alibi = torch.rand(batch, nheads, generator=g).to(DEVICE) * 0.3 if o.get("alibi") else None
    block_table = None
    k_cache, v_cache = k_dense, v_dense
    if o.get("page"):
        k_cache, block_table = _pages(k_dense, o["page"], g)
        v_cache = v_dense.new_empty(k_cache.shape)
        v_cache.normal_()
        v_cache[block_table.long()] = torch.nn.functional.pad(
            v_dense, (0, 0, 0, 0, 0, block_table.shape[1] * o["page"] - capacity)).view(
            cache_rows, block_table.shape[1], o["page"], nheads_k, head_dim)[:cache_rows]
    if o.get("no_seqlens"):
        seqlens_arg = None
        cache_seqlens = None
    elif o.get("int_seqlens"):
        seqlens_arg = int(lengths[0])
        cache_seqlens = torch.full((batch,), seqlens_arg, dtype=torch.int32, device=DEVICE)
    else:
        seqlens_arg = cache_seqlens
    kwargs = dict(k=k, v=v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens_arg, cache_batch_idx=batch_idx,
                  cache_leftpad=leftpad, block_table=block_table, causal=o.get("causal", False),
                  window_size=o.get("window", (-1, -1)), softcap=o.get("softcap", 0.0),
                  rotary_interleaved=o.get("interleaved", True), alibi_slopes=alibi)
    return q, k_cache, v_cache, cache_seqlens, kwargs


def _reference(q, k_cache, v_cache, cache_seqlens, kw, upcast):
    return kvcache_reference(q, k_cache, v_cache, kw["k"], kw["v"], kw["rotary_cos"], kw["rotary_sin"], cache_seqlens,
                             kw["cache_batch_idx"], kw["cache_leftpad"], kw["block_table"], kw["causal"],
                             kw["window_size"], kw["softcap"], kw["rotary_interleaved"], kw["alibi_slopes"], upcast)


def _expected_cache(k_cache, new, cache_seqlens, kw, rotate):
    """The cache after the append, written with plain indexing."""
    expected = k_cache.clone()
    if new is None:
        return expected
    if rotate and kw["rotary_cos"] is not None:
        pos = cache_seqlens.long()[:, None] + torch.arange(new.shape[1], device=new.device)
        new = rotary_ref(new, kw["rotary_cos"], kw["rotary_sin"], pos, kw["rotary_interleaved"])
    for i in range(new.shape[0]):
        row = i if kw["cache_batch_idx"] is None else int(kw["cache_batch_idx"][i])
        for j in range(new.shape[1]):
            p = int(cache_seqlens[i]) + j
            if kw["block_table"] is None:
                expected[row, p] = new[i, j]
            else:
                page_size = k_cache.shape[1]
                expected[int(kw["block_table"][row, p // page_size]), p % page_size] = new[i, j]
    return expected


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kvcache_matches_reference(name, dtype):
    if dtype == torch.float16 and not ON_GPU and name not in ("decode", "rotary_paged_causal_gqa", "leftpad"):
        pytest.skip("the interpreter runs the full matrix in bf16 only (CI time)")
    torch.manual_seed(zlib.crc32(name.encode()))
    q, k_cache, v_cache, cache_seqlens, kw = _make_case(name, dtype)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, **kw, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    # the append, in place: the new rows exactly where the spec puts them, every other element untouched
    exp_k = _expected_cache(before_k, kw["k"], cache_seqlens, kw, rotate=True)
    exp_v = _expected_cache(before_v, kw["v"], cache_seqlens, kw, rotate=False)
    if kw["rotary_cos"] is None:
        assert torch.equal(k_cache, exp_k), "k_cache after the append"
    else:
        # fp32 rotation rounded once; a one-ulp difference in the fp32 product may flip a rounding
        torch.testing.assert_close(k_cache, exp_k, rtol=1e-2, atol=1e-2)
        # bit for bit: the rows apply_rotary_emb gives, written where the spec puts them
        rotated = apply_rotary_emb(kw["k"], kw["rotary_cos"], kw["rotary_sin"], kw["rotary_interleaved"],
                                   seqlen_offsets=cache_seqlens)
        assert torch.equal(k_cache, _expected_cache(before_k, rotated, cache_seqlens, kw, rotate=False))
    assert torch.equal(v_cache, exp_v), "v_cache after the append"
    ref_out, ref_lse = _reference(q, before_k, before_v, cache_seqlens, kw, upcast=True)
    pt_out, pt_lse = _reference(q, before_k, before_v, cache_seqlens, kw, upcast=False)
    factor = ALIBI_FACTOR if kw["alibi_slopes"] is not None else FACTOR
    assert_close_to_ref("out", out, ref_out, pt_out, factor)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse), ~finite), "lse must be +inf exactly where a row sees no key"
    assert_close_to_ref("lse", lse, ref_lse, pt_lse, factor, where=finite)
    if not finite.all():
        assert torch.equal(out.transpose(1, 2)[~finite], torch.zeros_like(out.transpose(1, 2)[~finite]))


@pytest.mark.parametrize("name", ["decode_gqa_append", "rotary_paged_causal_gqa", "window_softcap_alibi",
                                  "seqlens_zero"])
def test_forced_splits_equal_no_split(name):
    results = []
    for splits in (1, 3, 7):
        torch.manual_seed(1)  # the same inputs for every split count
        q, k_cache, v_cache, _, kw = _make_case(name, torch.bfloat16, seed=4)
        results.append(flash_attn_with_kvcache(q, k_cache, v_cache, **kw, num_splits=splits, return_softmax_lse=True))
    (out1, lse1), *others = results
    for out, lse in others:
        torch.testing.assert_close(out, out1, rtol=0, atol=2e-2)  # one bf16 rounding apart at most
        torch.testing.assert_close(lse, lse1, rtol=1e-5, atol=1e-5)
        assert torch.equal(torch.isinf(lse), torch.isinf(lse1))


def test_varlen_with_block_table_matches_reference():
    torch.manual_seed(2)
    g = torch.Generator().manual_seed(2)
    dtype, nheads, nheads_k, head_dim, page = torch.bfloat16, 4, 2, 64, 5
    lens_q, lens_k = [3, 1, 6], [17, 0, 30]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q = randn(sum(lens_q), nheads, head_dim, dtype=dtype)
    k_dense = randn(3, 30, nheads_k, head_dim, dtype=dtype)
    v_dense = randn(3, 30, nheads_k, head_dim, dtype=dtype)
    k_pool, table = _pages(k_dense, page, g)
    v_pool = torch.empty_like(k_pool).normal_()
    v_pool[table.long()] = v_dense.view(3, 6, page, nheads_k, head_dim)
    out, lse, _ = flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                         block_table=table, return_attn_probs=True)
    for i in range(3):
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        ref, ref_lse = attention_ref(q[rows][None], k_dense[i:i + 1, :lens_k[i]], v_dense[i:i + 1, :lens_k[i]],
                                     causal=True)
        pt, _ = attention_ref(q[rows][None], k_dense[i:i + 1, :lens_k[i]], v_dense[i:i + 1, :lens_k[i]],
                              causal=True, upcast=False)
        assert_close_to_ref(f"out[{i}]", out[rows][None], ref, pt, FACTOR)
        assert torch.equal(torch.isinf(lse[:, rows]), torch.isinf(ref_lse[0]))


def test_paged_varlen_runs_forward_with_grad_and_only_its_backward_raises():
    # flash_attn runs the forward of a paged varlen call whose inputs require grad; only a backward has no kernel
    torch.manual_seed(3)
    q = randn(4, 2, 32, dtype=torch.bfloat16, requires_grad=True)
    pool = randn(3, 4, 2, 32, dtype=torch.bfloat16, requires_grad=True)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 6], dtype=torch.int32, device=DEVICE)
    table = torch.tensor([[0, 2]], dtype=torch.int32, device=DEVICE)
    out, lse, _ = flash_attn_varlen_func(q, pool, pool, cu, cu_k, 4, 6, causal=True, block_table=table,
                                         return_attn_probs=True)
    with torch.no_grad():
        ref, ref_lse, _ = flash_attn_varlen_func(q, pool, pool, cu, cu_k, 4, 6, causal=True, block_table=table,
                                                 return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad
    assert torch.equal(out.detach(), ref) and torch.equal(lse, ref_lse)
    with pytest.raises(NotImplementedError, match="block_table .* has no backward"):
        out.float().sum().backward()
    with pytest.raises(NotImplementedError, match="dropout"):
        flash_attn_varlen_func(q.detach(), pool, pool, cu, cu, 4, 4, dropout_p=0.1, block_table=table)


def _call(**overrides):
    q = randn(2, 1, 4, 32, dtype=torch.bfloat16)
    kc = randn(2, 16, 2, 32, dtype=torch.bfloat16)
    vc = randn(2, 16, 2, 32, dtype=torch.bfloat16)
    kn = randn(2, 1, 2, 32, dtype=torch.bfloat16)
    args = dict(q=q, k_cache=kc, v_cache=vc, k=kn, v=kn.clone(),
                cache_seqlens=torch.tensor([3, 5], dtype=torch.int32, device=DEVICE))
    args.update(overrides)
    return flash_attn_with_kvcache(**args)


def _cos_sin(rows, half):
    return randn(rows, half, dtype=torch.bfloat16), randn(rows, half, dtype=torch.bfloat16)


BAD_INPUTS = [
    (dict(v=None), ValueError, "k and v must be given together"),
    (dict(k=None, v=None, rotary_cos=_cos_sin(16, 8)[0], rotary_sin=_cos_sin(16, 8)[1]), ValueError, "need k and v"),
    (dict(rotary_cos=_cos_sin(16, 4)[0], rotary_sin=_cos_sin(16, 4)[1]), ValueError, "multiple of 16"),
    (dict(rotary_cos=_cos_sin(16, 24)[0], rotary_sin=_cos_sin(16, 24)[1]), ValueError, "at most headdim"),
    (dict(rotary_cos=_cos_sin(8, 8)[0], rotary_sin=_cos_sin(8, 8)[1]), ValueError, "fewer than the cache capacity"),
    (dict(rotary_cos=_cos_sin(16, 8)[0]), ValueError, "given together"),
    (dict(k_cache=randn(2, 16, 2, 32, dtype=torch.float16)), TypeError, "share one dtype"),
    # a narrower value cache is MLA's latent cache (test_mla.py), which takes no appended keys yet
    (dict(v_cache=randn(2, 16, 2, 16, dtype=torch.bfloat16)), NotImplementedError, "appended"),
    (dict(v_cache=randn(2, 16, 2, 64, dtype=torch.bfloat16)), ValueError, "v_cache's head dim"),
    (dict(k_cache=randn(2, 16, 2, 16, dtype=torch.bfloat16)), ValueError, "head dims differ"),
    (dict(k_cache=randn(2, 16, 3, 32, dtype=torch.bfloat16), v_cache=randn(2, 16, 3, 32, dtype=torch.bfloat16),
          k=randn(2, 1, 3, 32, dtype=torch.bfloat16), v=randn(2, 1, 3, 32, dtype=torch.bfloat16)), ValueError,
     "divisible"),
    (dict(k=randn(2, 1, 1, 32, dtype=torch.bfloat16)), ValueError, "seqlen_new, nheads_k"),
    (dict(cache_seqlens=None), ValueError, "needs cache_seqlens"),
    (dict(cache_seqlens=16), ValueError, "past the cache capacity"),
    (dict(cache_seqlens=torch.tensor([3, 5], dtype=torch.int64, device=DEVICE)), ValueError, "int32"),
    (dict(cache_seqlens=2.5), TypeError, "cache_seqlens must be an int"),
    (dict(cache_leftpad=torch.zeros(3, dtype=torch.int32, device=DEVICE)), ValueError, "cache_leftpad"),
    (dict(block_table=torch.zeros(2, 4, dtype=torch.int64, device=DEVICE)), ValueError, "block_table"),
    (dict(k_cache=randn(8, 4, 2, 32, dtype=torch.bfloat16), v_cache=randn(8, 5, 2, 32, dtype=torch.bfloat16),
          block_table=torch.zeros(2, 4, dtype=torch.int32, device=DEVICE)), ValueError, "page_block_size"),
    (dict(k_cache=randn(1, 16, 2, 32, dtype=torch.bfloat16), v_cache=randn(1, 16, 2, 32, dtype=torch.bfloat16)),
     ValueError, "batch rows"),
    (dict(num_splits=-1), ValueError, "num_splits"),
    (dict(alibi_slopes=torch.ones(3, device=DEVICE)), ValueError, "alibi_slopes"),
]


@pytest.mark.parametrize("overrides,exc,match", BAD_INPUTS, ids=[m for _, _, m in BAD_INPUTS])
def test_bad_inputs_raise_named_errors(overrides, exc, match):
    with pytest.raises(exc, match=match):
        _call(**overrides)


@pytest.mark.parametrize("bad,match", [
    (dict(cache_seqlens=[3, 16]), "past the cache capacity"),
    (dict(cache_seqlens=[3, -1]), "cache_seqlens below 0"),
    (dict(cache_leftpad=[0, 7]), "cache_leftpad"),
    (dict(cache_batch_idx=[0, 2]), "cache_batch_idx"),
    (dict(block_table=[[0, 1], [2, 9]]), "block_table entry"),
])
def test_bad_table_values_poison_the_sequence_and_raise_on_the_next_call(bad, match):
    cu_checks.flag(torch.device(DEVICE))[:] = 0  # what an earlier failed test may have left
    key, values = next(iter(bad.items()))
    tensor = torch.tensor(values, dtype=torch.int32, device=DEVICE)
    overrides = {key: tensor}
    if key == "block_table":
        pool = randn(4, 8, 2, 32, dtype=torch.bfloat16)
        overrides.update(k_cache=pool, v_cache=pool.clone(), cache_seqlens=torch.tensor([3, 12], dtype=torch.int32,
                                                                                        device=DEVICE))
    kc = overrides.get("k_cache", randn(2, 16, 2, 32, dtype=torch.bfloat16))
    overrides["k_cache"] = kc
    kn = randn(2, 1, 2, 32, dtype=torch.bfloat16)
    overrides.update(k=kn, v=kn.clone())
    before = kc.clone()
    out = _call(**overrides)
    if ON_GPU:
        torch.cuda.synchronize()
    assert torch.isnan(out[1]).all(), "the sequence with the bad value gives NaN"
    assert not torch.isnan(out[0]).any(), "the other sequence is computed"
    if key != "block_table":  # (a page entry is checked where it is read, after the append)
        # only the good sequence's new key row was written
        seqlens = overrides.get("cache_seqlens", torch.tensor([3, 5]))
        assert torch.equal(kc[0, int(seqlens[0])], kn[0, 0])
        kc[0, int(seqlens[0])] = before[0, int(seqlens[0])]
        assert torch.equal(kc, before), "the bad sequence wrote nothing"
    with pytest.raises(ValueError, match=match):
        _call()
    _call()  # the flag was cleared


def test_torch_compile_fullgraph_appends_in_place():
    q, k_cache, v_cache, cache_seqlens, kw = _make_case("rotary_paged_causal_gqa", torch.bfloat16, seed=9)
    k_eager, v_eager = k_cache.clone(), v_cache.clone()
    eager = flash_attn_with_kvcache(q, k_eager, v_eager, **kw)

    def step(q, k_cache, v_cache, k, v, cos, sin, seqlens, table):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, seqlens, block_table=table, causal=True)

    args = (q, k_cache, v_cache, kw["k"], kw["v"], kw["rotary_cos"], kw["rotary_sin"], cache_seqlens,
            kw["block_table"])
    ptr = k_cache.data_ptr()
    inductor = ON_GPU or shutil.which("g++") is not None
    compiled = torch.compile(step, fullgraph=True, backend="inductor" if inductor else "aot_eager")
    if inductor:
        from torch._inductor.utils import run_and_get_code

        out, code = run_and_get_code(compiled, *args)
        calls = [line for line in code[0].splitlines() if "flashattn2.fwd_kvcache" in line and "= torch.ops" in line]
        # the op runs on the caller's caches (graph inputs 1 and 2), with no copy in or out
        assert len(calls) == 1 and "(arg0_1, arg1_1, arg2_1," in calls[0], calls
        assert ".copy_(" not in code[0] and "clone" not in code[0]
    else:
        out = compiled(*args)
    assert k_cache.data_ptr() == ptr
    assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager), "the caller's cache holds the append"
    assert torch.equal(out, eager)


@pytest.mark.gpu
def test_decode_loop_under_cuda_graph_capture_and_without_syncs():
    torch.manual_seed(3)
    batch, nheads, nheads_k, d, capacity, steps = 3, 8, 2, 128, 256, 4
    dtype = torch.bfloat16
    k_cache = randn(batch, capacity, nheads_k, d, dtype=dtype)
    v_cache = randn(batch, capacity, nheads_k, d, dtype=dtype)
    seqlens = torch.tensor([5, 100, 0], dtype=torch.int32, device="cuda")
    qs = [randn(batch, 1, nheads, d, dtype=dtype) for _ in range(steps)]
    ks = [randn(batch, 1, nheads_k, d, dtype=dtype) for _ in range(steps)]
    vs = [randn(batch, 1, nheads_k, d, dtype=dtype) for _ in range(steps)]
    # eager run on copies, after a first call that compiles (the steady state must not sync)
    flash_attn_with_kvcache(qs[0], k_cache.clone(), v_cache.clone(), ks[0], vs[0], cache_seqlens=seqlens.clone(),
                            causal=True)
    ke, ve, se = k_cache.clone(), v_cache.clone(), seqlens.clone()
    eager = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t in range(steps):
            eager.append(flash_attn_with_kvcache(qs[t], ke, ve, ks[t], vs[t], cache_seqlens=se, causal=True))
            se += 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # captured: static buffers, the step replayed with the lengths advanced in place
    sq, sk, sv = qs[0].clone(), ks[0].clone(), vs[0].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_with_kvcache(sq, k_cache, v_cache, sk, sv, cache_seqlens=seqlens, causal=True)
        seqlens.add_(1)
    for t in range(steps):
        sq.copy_(qs[t])
        sk.copy_(ks[t])
        sv.copy_(vs[t])
        graph.replay()
        assert torch.equal(out, eager[t]), f"step {t}"
    assert torch.equal(k_cache, ke) and torch.equal(v_cache, ve)


@pytest.mark.gpu
def test_64_bit_cache_offsets():
    # page index * page stride passes 2**31 elements: the offsets must be 64-bit
    dtype, d, page = torch.bfloat16, 128, 256
    num_blocks = 2**31 // (page * d) + 4  # 2**31 elements of K alone: 4 GiB in bf16
    pool = torch.empty(num_blocks, page, 1, d, dtype=dtype, device="cuda")
    last = num_blocks - 1
    pool[last].normal_()
    table = torch.tensor([[last]], dtype=torch.int32, device="cuda")
    q = randn(1, 1, 1, d, dtype=dtype)
    out = flash_attn_with_kvcache(q, pool, pool, block_table=table, cache_seqlens=page)
    ref, _ = attention_ref(q, pool[last:last + 1], pool[last:last + 1])
    pt, _ = attention_ref(q, pool[last:last + 1], pool[last:last + 1], upcast=False)
    assert_close_to_ref("out", out, ref, pt, FACTOR)


def test_flag_words_are_separate():
    assert cu_checks.KVCACHE_WORD.value != cu_checks.CU_SEQLENS_WORD
    assert flashattn2.flash_attn_with_kvcache is flash_attn_with_kvcache


def test_a_repeated_call_skips_the_checks_but_not_the_work():
    from flashattn2 import inference

    inference._seen.clear()
    q, k_cache, v_cache, cache_seqlens, kw = _make_case("decode_gqa_append", torch.bfloat16, seed=11)
    kw.pop("cache_seqlens")
    cache_seqlens = torch.tensor([5, 9, 20], dtype=torch.int32, device=DEVICE)
    first_k = k_cache.clone()
    out1 = flash_attn_with_kvcache(q, k_cache, v_cache, **kw, cache_seqlens=cache_seqlens)
    assert len(inference._seen) == 1
    # the same layouts again, one step later: remembered, and the append lands one row further
    out2 = flash_attn_with_kvcache(q, k_cache, v_cache, **kw, cache_seqlens=cache_seqlens + 1)
    assert len(inference._seen) == 1
    for i in range(q.shape[0]):
        assert torch.equal(k_cache[i, int(cache_seqlens[i]) + 1], kw["k"][i, 0])
    assert not torch.equal(out1, out2)
    assert not torch.equal(k_cache, first_k)
    # a changed shape is checked afresh
    with pytest.raises(ValueError, match="seqlen_new, nheads_k"):
        flash_attn_with_kvcache(q, k_cache, v_cache, kw["k"][:, :, :1], kw["v"], cache_seqlens=cache_seqlens)
