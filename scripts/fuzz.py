"""Seeded random cases over the API against the float64 reference by flash_attn's rule (issue 30, first step): FA2's,
or FA3/FA4's with its rounding allowance (--rule, RULE below says why).

    python scripts/fuzz.py --mode valid --cases 200 --seed 0       # on a GPU (or TRITON_INTERPRET=1 on the CPU)
    python scripts/fuzz.py --mode invalid --cases 1000 --seed 0    # bad arguments: each must raise a named error

valid: flash_attn_func and flash_attn_varlen_func (forward and backward) over dtypes, head dims 1-256, lengths
1-`--max-len` (cut tiles included), GQA ratios, causal, windows, softcap, ALiBi, softmax_scale and (dense calls)
attention sinks and value head dims unlike the query's; flash_attn_with_kvcache over dense and paged caches (any
page size) with per-sequence lengths, appended keys, rotary and split-KV, and over MLA's latent cache (the Gluon
kernel forced for half of those); flash_attn_combine of key parts; FP8
inputs; and flex_attention over a family of mask_mods, with and without a score_mod. invalid: wrong dtypes, ranks,
shapes, head counts, windows, dropout, softcap, scales and cu_seqlens, and (flash_attn_with_kvcache,
flash_attn_combine) cache lengths, block tables, page sizes, latent caches, rotary tables, sinks and partials;
each must raise TypeError, ValueError or
NotImplementedError (never another error, a crash or a silent answer). Every failure prints a one-line
reproducer (`--only N` reruns case N of a seed).
"""

import argparse
import functools
import os
import random
import sys
import time
import traceback

import torch

import flashattn2
from flashattn2.reference import attention_fp8_ref, attention_ref, flex_attention_ref, max_abs_error, within_tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FWD, BWD, FLOOR = 2.0, 3.0, 1e-5
# flash_attn_with_kvcache's outputs: flash_attn's own test_flash_attn_kvcache rule (3x PyTorch's error + 1e-5; 5x
# with ALiBi, which these cases do not draw), as tests/test_kvcache.py's FACTOR
KVCACHE = 3.0
HEAD_DIMS = (1, 8, 16, 32, 40, 59, 64, 80, 96, 128, 160, 192, 256)
NAMED = (TypeError, ValueError, NotImplementedError)


def _options(rng: random.Random, lrng: random.Random, seqlen_q: int, seqlen_k: int) -> dict:
    opts = {}
    if rng.random() < 0.4:
        opts["causal"] = True
    elif rng.random() < 0.3:
        opts["window_size"] = (lrng.randint(-1, seqlen_k), lrng.randint(-1, seqlen_k))
    if rng.random() < 0.2:
        opts["softcap"] = rng.choice((5.0, 30.0))
    if rng.random() < 0.2:
        opts["softmax_scale"] = lrng.uniform(0.05, 1.0)
    return opts


# The verdict (--rule). "flash_attn": a check passes by flash_attn's rule of either generation: FA2's (FWD / BWD x
# PyTorch's error + FLOOR, as tests/helpers.py) or FA3/FA4's (FA3_FACTOR x PyTorch's error + 2 roundings of
# ref + 0.3 in the output's dtype, their hopper/ and cute/ tests' allowance for tiny outputs where PyTorch's max
# error is a lucky fraction of an ulp). "fa2": FA2's alone. The failures FA2's rule alone left on the GPU (seeds 5-10)
# were two classes, each within FA3/FA4's rule: head dim 1 (one channel: the max over 1-6 outputs makes a factor
# rule a coin toss) and one-key sequences' exact-zero gradients (NOTES.md, twelfth session). flex_attention cases on
# a GPU also pass within the factor of PyTorch's own FlexAttention's error (_compare's peer): its Delta comes from
# the rounded output as ours does (seed 11, case 4751). Checks that pass by FA3/FA4's rule or that peer alone are
# listed in LENIENT and counted at the end of a run.
RULE = "flash_attn"
FA3_FACTOR = 2.0
LENIENT: list[str] = []


def _check(name, ours, ref, pt, factor):
    passed, err, pt_err = within_tolerance(ours, ref, pt, factor, FLOOR)
    nan = bool(torch.isnan(ours).any())
    if passed and not nan:
        return
    rd = ref.to(ours.dtype)
    atol = 2 * (rd + 0.3 - 0.3 - rd).abs().max().item() if ref.numel() else 0.0
    within = not nan and err <= FA3_FACTOR * pt_err + atol
    message = (f"{name}: error {err:.3e} > {factor} x PyTorch's {pt_err:.3e} + {FLOOR} (within FA3/FA4's rule, "
               f"{FA3_FACTOR} x + the rounding allowance {atol:.1e}: {'yes' if within else 'no'})")
    if within and RULE == "flash_attn":
        LENIENT.append(message)
        return
    raise AssertionError(message)


def _references(reference, ins, dout, grads: bool):
    """(out, dq, dk, dv) of reference(*ins, upcast=...) in float64 and in the input dtype (no grads: None)."""
    results = []
    for upcast in (True, False):
        # float64 leaves for the oracle: with input-dtype leaves its gradients come back rounded to that dtype, and
        # a true value near a rounding midpoint then reads as one ulp of error (fuzz seed 4, case 1100)
        xs = [(x.detach().double() if upcast else x.detach()).requires_grad_(grads) for x in ins]
        ref, _ = reference(*xs, upcast=upcast)
        if grads:
            ref.backward(dout.double() if upcast else dout)
        results.append((ref, *(x.grad for x in xs)))
    return results


def _delta_grads(reference, ins, dout, out):
    """(dq, dk, dv) in float64 with FlashAttention's Delta = rowsum(dO o out) taken from our rounded `out` instead of
    the exact output: the error that rounding point alone costs, exact arithmetic otherwise. dS then gains
    P (Delta - Delta'), the gradient through the scores of (Delta - Delta') . lse, so that term joins the loss."""
    xs = [x.detach().double().requires_grad_() for x in ins]
    exact, lse = reference(*xs, upcast=True)
    dout = dout.double()
    shift = (dout * (exact.detach() - out.detach().double())).sum(-1)
    if shift.shape != lse.shape:  # (batch, seqlen, heads) against lse's (batch, heads, seqlen)
        shift = shift.transpose(1, 2)
    lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # rows that see no key: no term
    ((exact * dout).sum() + (shift * lse).sum()).backward()
    return [x.grad for x in xs]


def _compare(label: str, out, grads, ref, pt, delta=None, fwd=FWD, peer=None):
    """out against the references by flash_attn's rule (fwd x PyTorch's error), and the gradients (dq, dk, dv) when
    given. delta: a callable giving _delta_grads, asked only when a gradient fails, to say whether that rounding
    point explains it. peer: a callable giving (out, dq, dk, dv) of PyTorch's own kernel for the call in the input
    dtype (flex_attention: torch's FlexAttention), asked only when a check fails: under RULE "flash_attn" a check
    within the factor of the larger of PyTorch's two errors passes, listed in LENIENT."""
    peer = functools.cache(peer) if peer is not None else None
    for i, (name, ours) in enumerate(zip(("out", "dq", "dk", "dv"), (out, *grads) if grads else (out,),
                                         strict=False)):
        factor = fwd if i == 0 else BWD
        try:
            _check(f"{name}{label}", ours, ref[i], pt[i], factor)
        except AssertionError as e:
            note = ""
            if delta is not None and i > 0:
                d_err = max_abs_error(delta()[i - 1], ref[i])
                explained = max_abs_error(ours, ref[i]) <= BWD * max(d_err, max_abs_error(pt[i], ref[i])) + FLOOR
                note = (f" (Delta from our rounded out costs {d_err:.3e} alone; within {BWD} x the larger baseline: "
                        f"{'yes' if explained else 'no'})")
            if peer is not None and RULE == "flash_attn":
                p_err = max_abs_error(peer()[i], ref[i])
                within = max_abs_error(ours, ref[i]) <= factor * max(p_err, max_abs_error(pt[i], ref[i])) + FLOOR
                note += f" (PyTorch's FlexAttention: error {p_err:.3e}; within {factor} x: {'yes' if within else 'no'})"
                if within:
                    LENIENT.append(f"{e}{note}")
                    continue
            raise AssertionError(f"{e}{note}") from None


def _dense_case(rng: random.Random, lrng: random.Random, max_len: int, grads: bool) -> tuple[str, callable]:
    dtype = rng.choice((torch.float16, torch.bfloat16))
    head_dim = rng.choice(HEAD_DIMS)
    nheads_k = rng.choice((1, 2))
    nheads = nheads_k * rng.choice((1, 2, 3))
    batch, seqlen_q, seqlen_k = lrng.randint(1, 2), lrng.randint(1, max_len), lrng.randint(1, max_len)
    opts = _options(rng, lrng, seqlen_q, seqlen_k)
    alibi = rng.random() < 0.2
    sink = rng.random() < 0.15
    head_dim_v = rng.choice(HEAD_DIMS) if rng.random() < 0.15 else head_dim  # MLA-style calls
    desc = (f"flash_attn_func batch={batch} seqlen_q={seqlen_q} seqlen_k={seqlen_k} nheads={nheads} "
            f"nheads_k={nheads_k} head_dim={head_dim} head_dim_v={head_dim_v} dtype={dtype} alibi={alibi} "
            f"sink={sink} grads={grads} {opts}")

    def run():
        q = torch.randn(batch, seqlen_q, nheads, head_dim, device=DEVICE, dtype=dtype, requires_grad=grads)
        k = torch.randn(batch, seqlen_k, nheads_k, head_dim, device=DEVICE, dtype=dtype, requires_grad=grads)
        v = torch.randn(batch, seqlen_k, nheads_k, head_dim_v, device=DEVICE, dtype=dtype, requires_grad=grads)
        kwargs = dict(opts)
        if alibi:
            kwargs["alibi_slopes"] = torch.rand(batch, nheads, device=DEVICE, dtype=torch.float32)
        if sink:
            kwargs["learnable_sink"] = torch.randn(nheads, device=DEVICE) * 2
        out = flashattn2.flash_attn_func(q, k, v, **kwargs)
        dout = torch.randn_like(out)
        reference = functools.partial(attention_ref, **kwargs)
        ref, pt = _references(reference, (q, k, v), dout, grads)
        if grads:
            out.backward(dout)
        _compare("", out, [x.grad for x in (q, k, v)] if grads else (), ref, pt,
                 functools.partial(_delta_grads, reference, (q, k, v), dout, out))

    return desc, run


def _varlen_case(rng: random.Random, lrng: random.Random, max_len: int, grads: bool) -> tuple[str, callable]:
    dtype = rng.choice((torch.float16, torch.bfloat16))
    head_dim = rng.choice(HEAD_DIMS)
    nheads_k = rng.choice((1, 2))
    nheads = nheads_k * rng.choice((1, 2))
    lens_q = [lrng.randint(0, max_len) for _ in range(lrng.randint(1, 3))]
    lens_k = [lrng.randint(1, max_len) for _ in lens_q]
    opts = _options(rng, lrng, max(lens_q), max(lens_k))
    desc = (f"flash_attn_varlen_func lens_q={lens_q} lens_k={lens_k} nheads={nheads} nheads_k={nheads_k} "
            f"head_dim={head_dim} dtype={dtype} grads={grads} {opts}")

    def run():
        cu = [torch.tensor([0] + lens, device=DEVICE).cumsum(0).to(torch.int32) for lens in (lens_q, lens_k)]
        q = torch.randn(sum(lens_q), nheads, head_dim, device=DEVICE, dtype=dtype, requires_grad=grads)
        k, v = (torch.randn(sum(lens_k), nheads_k, head_dim, device=DEVICE, dtype=dtype, requires_grad=grads)
                for _ in range(2))
        out = flashattn2.flash_attn_varlen_func(q, k, v, cu[0], cu[1], max(lens_q), max(lens_k), **opts)
        dout = torch.randn_like(out)
        if grads:
            out.backward(dout)
        for i, (lq, lk) in enumerate(zip(lens_q, lens_k, strict=True)):
            if lq == 0:
                continue
            sq, sk = slice(int(cu[0][i]), int(cu[0][i]) + lq), slice(int(cu[1][i]), int(cu[1][i]) + lk)
            # a key sequence's gradient gathers only its own queries: compare sequence by sequence
            seq = [x.detach()[s][None] for x, s in ((q, sq), (k, sk), (v, sk))]
            reference = functools.partial(attention_ref, **opts)
            ref, pt = _references(reference, seq, dout[sq][None], grads)
            mine = [x.grad[s][None] for x, s in ((q, sq), (k, sk), (v, sk))] if grads else ()
            _compare(f" (sequence {i})", out[sq][None], mine, ref, pt,
                     functools.partial(_delta_grads, reference, seq, dout[sq][None], out[sq][None]))

    return desc, run


def _paged(denses, page: int, fill: float):
    """(block table, page pools) holding the dense caches (batch, capacity, ...) in pages of `page` rows in a
    shuffled order; rows past the capacity hold `fill`."""
    batch, capacity = denses[0].shape[:2]
    per_seq = -(-capacity // page)
    order = torch.randperm(batch * per_seq, device=DEVICE)
    pools = []
    for dense in denses:
        rest = dense.shape[2:]
        full = torch.full((batch, per_seq * page, *rest), fill, device=DEVICE, dtype=dense.dtype)
        full[:, :capacity] = dense
        pool = torch.empty(batch * per_seq, page, *rest, device=DEVICE, dtype=dense.dtype)
        pool[order] = full.view(batch * per_seq, page, *rest)
        pools.append(pool)
    return order.view(batch, per_seq).to(torch.int32), pools


def _kvcache_case(rng: random.Random, lrng: random.Random, max_len: int, grads: bool) -> tuple[str, callable]:
    """flash_attn_with_kvcache over a dense or paged cache (any page size) with per-sequence lengths."""
    dtype = rng.choice((torch.float16, torch.bfloat16))
    head_dim = rng.choice(HEAD_DIMS)
    nheads_k = rng.choice((1, 2))
    nheads = nheads_k * rng.choice((1, 2, 4))
    batch, seqlen_q = lrng.randint(1, 3), lrng.choice((1, 1, 2, lrng.randint(1, 16)))
    lens = [lrng.randint(seqlen_q, max(seqlen_q, max_len)) for _ in range(batch)]
    capacity = max(lens) + lrng.randint(0, 20)
    page = rng.choice((None, None, 1, 16, 48, 64, 256))
    opts = _options(rng, lrng, seqlen_q, capacity)
    # appended keys (seqlen_q new ones after each sequence's cached ones), rotary on q and them, split-KV
    append = rng.random() < 0.3
    rotary = append and head_dim >= 16 and rng.random() < 0.5  # rotary dims are multiples of 16
    interleaved = rng.random() < 0.5
    num_splits = rng.choice((0, 0, 1, 2, 5))
    if append:
        lens = [n - seqlen_q for n in lens]  # the cached lengths before the append
    desc = (f"flash_attn_with_kvcache batch={batch} seqlen_q={seqlen_q} cache_seqlens={lens} capacity={capacity} "
            f"page_block_size={page} nheads={nheads} nheads_k={nheads_k} head_dim={head_dim} dtype={dtype} "
            f"append={append} rotary={rotary} interleaved={interleaved} num_splits={num_splits} {opts}")
    # drawn from a generator of its own (the case's description seeds it): every earlier draw stays what it was
    sink = random.Random(desc).random() < 0.2
    desc += f" sink={sink}"

    def run():
        q = torch.randn(batch, seqlen_q, nheads, head_dim, device=DEVICE, dtype=dtype)
        k_dense, v_dense = (torch.randn(batch, capacity, nheads_k, head_dim, device=DEVICE, dtype=dtype)
                            for _ in range(2))
        seqlens = torch.tensor(lens, device=DEVICE, dtype=torch.int32)
        block_table, k_cache, v_cache = None, k_dense, v_dense
        if page is not None:
            block_table, (k_cache, v_cache) = _paged((k_dense, v_dense), page, 0.0)
        extra = {}
        if append:
            extra["k"], extra["v"] = (torch.randn(batch, seqlen_q, nheads_k, head_dim, device=DEVICE, dtype=dtype)
                                      for _ in range(2))
        if rotary:
            rot = 16 * lrng.randint(1, head_dim // 16)
            # the tables cover the cache's capacity: a paged one's is its pages' rows
            positions = capacity if block_table is None else block_table.shape[1] * page
            angles = torch.rand(positions, rot // 2, device=DEVICE) * 6.3
            extra.update(rotary_cos=angles.cos().to(dtype), rotary_sin=angles.sin().to(dtype),
                         rotary_interleaved=interleaved)
        k_ref, v_ref = k_dense.clone(), v_dense.clone()  # the dense cache is k_cache itself: the call writes it
        # the last of the case's torch draws, so that the others stay what they were
        sinks = torch.randn(nheads, device=DEVICE) * 2 if sink else None
        out = flashattn2.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=block_table,
                                                 num_splits=num_splits, learnable_sink=sinks, **extra, **opts)
        if rotary:
            # flash_attn's positions: the new keys' own; q's the same under a mask, else all at the first new key's
            cos, sin = extra["rotary_cos"], extra["rotary_sin"]
            extra["k"] = flashattn2.apply_rotary_emb(extra["k"], cos, sin, interleaved, seqlen_offsets=seqlens)
            if opts.get("causal") or "window_size" in opts:
                q = flashattn2.apply_rotary_emb(q, cos, sin, interleaved, seqlen_offsets=seqlens)
            else:
                flat = q.reshape(batch, 1, seqlen_q * nheads, head_dim)
                q = flashattn2.apply_rotary_emb(flat, cos, sin, interleaved, seqlen_offsets=seqlens).view_as(q)
        for b, n in enumerate(lens):
            if append:  # the cache as the call must have left it: the new keys after the cached ones
                k_ref[b, n:n + seqlen_q] = extra["k"][b]
                v_ref[b, n:n + seqlen_q] = extra["v"][b]
                if page is None:  # the rotated keys stored (both rotations round once to the input dtype)
                    torch.testing.assert_close(k_cache[b, n:n + seqlen_q], k_ref[b, n:n + seqlen_q], rtol=1e-2,
                                               atol=1e-2, msg=lambda m, b=b: f"appended keys (sequence {b}): {m}")
                n += seqlen_q
            seq = (q[b:b + 1], k_ref[b:b + 1, :n], v_ref[b:b + 1, :n])
            ref, pt = _references(functools.partial(attention_ref, learnable_sink=sinks, **opts), seq, None, False)
            _compare(f" (sequence {b})", out[b:b + 1], (), ref, pt, fwd=KVCACHE)

    return desc, run


def _latent_case(rng: random.Random, lrng: random.Random, max_len: int, grads: bool) -> tuple[str, callable]:
    """flash_attn_with_kvcache over MLA's latent cache (576/512, one KV head): the value cache a view of the key
    cache's first channels or a cache of its own, dense or paged; half the cases forced onto the Gluon kernel
    (sm90/latent.py, where it takes the call; "auto" takes it only past 32k cached keys)."""
    dtype = rng.choice((torch.float16, torch.bfloat16))
    nheads = rng.choice((16, 64, 128))
    batch, seqlen_q = lrng.randint(1, 3), rng.choice((1, 1, 2))
    lens = [lrng.randint(0, max(1, max_len)) for _ in range(batch)]
    capacity = max(max(lens), 1) + lrng.randint(0, 70)
    page = rng.choice((None, None, 64, 128, 16))
    view = rng.random() < 0.8
    causal = rng.random() < 0.5
    num_splits = rng.choice((0, 0, 1, 3))
    backend = rng.choice(("auto", "gluon"))
    desc = (f"flash_attn_with_kvcache (latent) batch={batch} seqlen_q={seqlen_q} cache_seqlens={lens} "
            f"capacity={capacity} page_block_size={page} nheads={nheads} dtype={dtype} v_view={view} "
            f"causal={causal} num_splits={num_splits} backend={backend}")

    def run():
        q = torch.randn(batch, seqlen_q, nheads, 576, device=DEVICE, dtype=dtype)
        k_dense = torch.randn(batch, capacity, 1, 576, device=DEVICE, dtype=dtype)
        v_dense = k_dense[..., :512] if view else torch.randn(batch, capacity, 1, 512, device=DEVICE, dtype=dtype)
        for b, n in enumerate(lens):  # the capacity past each sequence is never read: NaN says so if it is
            k_dense[b, n:] = float("nan")
            if not view:
                v_dense[b, n:] = float("nan")
        seqlens = torch.tensor(lens, device=DEVICE, dtype=torch.int32)
        block_table, k_cache, v_cache = None, k_dense, v_dense
        if page is not None:
            block_table, pools = _paged((k_dense,) if view else (k_dense, v_dense), page, float("nan"))
            k_cache = pools[0]
            v_cache = k_cache[..., :512] if view else pools[1]  # a value pool of its own: the same pages
        flashattn2.set_backend(backend)
        try:
            out = flashattn2.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                     block_table=block_table, causal=causal, num_splits=num_splits)
        finally:
            flashattn2.set_backend(os.environ.get("FLASHATTN2_BACKEND", "auto"))
        for b, n in enumerate(lens):
            if n == 0:  # a sequence with no key: out is 0 (flash_attn's convention)
                assert torch.all(out[b] == 0), f"sequence {b} sees no key but its out is not 0"
                continue
            # 16 query heads at a time: the reference repeats the one KV head per query head, 128 x 16k x 576
            # float64 would be 9.6 GB; the outputs joined give the same max errors the rule compares
            parts = [_references(functools.partial(attention_ref, causal=causal),
                                 (q[b:b + 1, :, h:h + 16], k_dense[b:b + 1, :n], v_dense[b:b + 1, :n]), None, False)
                     for h in range(0, nheads, 16)]
            ref, pt = ((torch.cat([part[j][0] for part in parts], dim=2),) for j in (0, 1))
            _compare(f" (sequence {b})", out[b:b + 1], (), ref, pt, fwd=KVCACHE)

    return desc, run


def _combine_case(rng: random.Random, lrng: random.Random, max_len: int, grads: bool) -> tuple[str, callable]:
    """flash_attn_combine of the keys split in parts (flash_attn_func's out and lse of each) against one call."""
    dtype = rng.choice((torch.float16, torch.bfloat16))
    head_dim = rng.choice(HEAD_DIMS)
    out_dtype = rng.choice((torch.float32, dtype))
    batch, seqlen_q, nheads = lrng.randint(1, 2), lrng.randint(1, 64), lrng.randint(1, 3)
    cuts = sorted(lrng.sample(range(1, max(2, max_len)), min(lrng.randint(1, 4), max(1, max_len - 1))))
    seqlen_k = cuts[-1] + lrng.randint(1, 16)
    bounds = [0] + cuts + [seqlen_k]
    desc = (f"flash_attn_combine batch={batch} seqlen_q={seqlen_q} seqlen_k={seqlen_k} parts={bounds} "
            f"nheads={nheads} head_dim={head_dim} dtype={dtype} out_dtype={out_dtype}")

    def run():
        q = torch.randn(batch, seqlen_q, nheads, head_dim, device=DEVICE, dtype=dtype)
        k, v = (torch.randn(batch, seqlen_k, nheads, head_dim, device=DEVICE, dtype=dtype) for _ in range(2))
        outs, lses = [], []
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            o, lse, _ = flashattn2.flash_attn_func(q, k[:, lo:hi], v[:, lo:hi], return_attn_probs=True)
            outs.append(o.float())
            lses.append(lse.transpose(1, 2))  # (batch, seqlen, heads), as combine takes it
        out, _ = flashattn2.flash_attn_combine(torch.stack(outs), torch.stack(lses), out_dtype=out_dtype)
        ref, pt = _references(attention_ref, (q, k, v), None, False)
        _compare("", out, (), ref, pt)

    return desc, run


def _fp8_case(rng: random.Random, lrng: random.Random, max_len: int, grads: bool) -> tuple[str, callable]:
    """flash_attn_func on e4m3 inputs (quantize_fp8) against attention_fp8_ref, forward only."""
    head_dim = rng.choice((64, 128, 256))
    nheads_k = rng.choice((1, 2))
    nheads = nheads_k * rng.choice((1, 2))
    causal = rng.random() < 0.5
    batch, seqlen_q, seqlen_k = lrng.randint(1, 2), lrng.randint(1, max_len), lrng.randint(1, max_len)
    desc = (f"flash_attn_func fp8 batch={batch} seqlen_q={seqlen_q} seqlen_k={seqlen_k} nheads={nheads} "
            f"nheads_k={nheads_k} head_dim={head_dim} causal={causal}")

    def run():
        q = torch.randn(batch, seqlen_q, nheads, head_dim, device=DEVICE, dtype=torch.bfloat16)
        k, v = (torch.randn(batch, seqlen_k, nheads_k, head_dim, device=DEVICE, dtype=torch.bfloat16)
                for _ in range(2))
        q8, k8, v8, *descales = flashattn2.quantize_fp8(q, k, v)
        out = flashattn2.flash_attn_func(q8, k8, v8, causal=causal, q_descale=descales[0], k_descale=descales[1],
                                         v_descale=descales[2])
        ref, _ = attention_fp8_ref(q8, k8, v8, *descales, causal=causal)
        pt, _ = attention_fp8_ref(q8, k8, v8, *descales, causal=causal, upcast=False)
        _check("out", out, ref, pt, FWD)

    return desc, run


MASK_MODS = {
    "causal": lambda b, h, q_idx, kv_idx: q_idx >= kv_idx,
    "sliding": lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx < 37),
    "prefix": lambda b, h, q_idx, kv_idx: (kv_idx < 50) | (q_idx >= kv_idx),
    "strided": lambda b, h, q_idx, kv_idx: (kv_idx % 3 == 0) | (h == 0),
}


def _flex_case(rng: random.Random, lrng: random.Random, max_len: int, grads: bool) -> tuple[str, callable]:
    dtype = rng.choice((torch.float16, torch.bfloat16))
    head_dim = rng.choice((16, 32, 64, 128))
    nheads_k = rng.choice((1, 2))
    nheads = nheads_k * rng.choice((1, 2))
    batch, seqlen_q, seqlen_k = lrng.randint(1, 2), lrng.randint(1, max_len), lrng.randint(1, max_len)
    mod = rng.choice(sorted(MASK_MODS))
    block = rng.choice(((32, 32), (64, 64), (32, 64), (128, 128)))
    # drawn last, from the lengths' generator: the earlier draws of every case stay what they were
    score = lrng.choice((None, None, None, "alibi", "softcap"))
    desc = (f"flex_attention batch={batch} seqlen_q={seqlen_q} seqlen_k={seqlen_k} nheads={nheads} "
            f"nheads_k={nheads_k} head_dim={head_dim} dtype={dtype} mask_mod={mod} BLOCK_SIZE={block} "
            f"score_mod={score} grads={grads}")

    def run():
        from torch.nn.attention.flex_attention import create_mask

        mask_mod = MASK_MODS[mod]
        q = torch.randn(batch, nheads, seqlen_q, head_dim, device=DEVICE, dtype=dtype, requires_grad=grads)
        k, v = (torch.randn(batch, nheads_k, seqlen_k, head_dim, device=DEVICE, dtype=dtype, requires_grad=grads)
                for _ in range(2))
        block_mask = flashattn2.create_block_mask(mask_mod, None, nheads, seqlen_q, seqlen_k, device=DEVICE,
                                                  BLOCK_SIZE=block)
        slopes = torch.rand(nheads, device=DEVICE)
        score_mod = {None: None, "alibi": lambda s, b, h, qi, ki: s + slopes[h] * (ki - qi),
                     "softcap": lambda s, b, h, qi, ki: 4.0 * torch.tanh(s / 4.0)}[score]
        out = flashattn2.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                        enable_gqa=nheads != nheads_k)
        mask = create_mask(mask_mod, 1, nheads, seqlen_q, seqlen_k, device=DEVICE)
        dout = torch.randn_like(out)
        reference = functools.partial(flex_attention_ref, mask=mask, score_mod=score_mod)
        ref, pt = _references(reference, (q, k, v), dout, grads)
        if grads:
            out.backward(dout)

        def peer():  # torch's FlexAttention (compiled: its kernel) on the same inputs in their dtype
            from torch.nn.attention import flex_attention as torch_flex

            xs = [x.detach().requires_grad_(grads) for x in (q, k, v)]
            mask = torch_flex.create_block_mask(mask_mod, None, nheads, seqlen_q, seqlen_k, device=DEVICE)
            o = torch.compile(torch_flex.flex_attention)(*xs, score_mod=score_mod, block_mask=mask,
                                                         enable_gqa=nheads != nheads_k)
            if grads:
                o.backward(dout)
            return (o, *(x.grad for x in xs))

        _compare("", out, [x.grad for x in (q, k, v)] if grads else (), ref, pt,
                 functools.partial(_delta_grads, reference, (q, k, v), dout, out),
                 peer=peer if DEVICE == "cuda" else None)  # FlexAttention has no backward on the CPU

    return desc, run


def _invalid_case(rng: random.Random) -> tuple[str, callable]:
    """One bad argument on an otherwise valid flash_attn_func / flash_attn_varlen_func call."""
    kind = rng.choice(("dtype", "rank", "batch", "head_dim", "heads", "big_head", "dropout", "softcap", "scale",
                       "sink_shape", "sink_dtype", "sink_dropout", "big_v_head",
                       "alibi", "device_mix", "cu_dtype", "cu_len"))

    def run():
        q, k, v = (torch.randn(1, 16, 2, 32, device=DEVICE, dtype=torch.float16) for _ in range(3))
        kwargs = {}
        if kind == "dtype":
            q, k, v = q.float(), k.float(), v.float()
        elif kind == "rank":
            q = q[0]
        elif kind == "batch":
            q = torch.cat([q, q])
        elif kind == "head_dim":
            q = torch.randn(1, 16, 2, 16, device=DEVICE, dtype=torch.float16)
        elif kind == "heads":
            k, v = (torch.randn(1, 16, 3, 32, device=DEVICE, dtype=torch.float16) for _ in range(2))
        elif kind == "big_head":
            q, k, v = (torch.randn(1, 16, 2, 288, device=DEVICE, dtype=torch.float16) for _ in range(3))
        elif kind == "dropout":
            kwargs["dropout_p"] = rng.choice((-0.1, 1.0, 1.5))
        elif kind == "softcap":
            kwargs["softcap"] = -1.0
        elif kind == "scale":
            kwargs["softmax_scale"] = rng.choice((0.0, -1.0))
        elif kind == "alibi":
            kwargs["alibi_slopes"] = torch.rand(3, device=DEVICE)
        elif kind == "sink_shape":
            kwargs["learnable_sink"] = torch.zeros(3, device=DEVICE)
        elif kind == "sink_dtype":
            kwargs["learnable_sink"] = torch.zeros(2, device=DEVICE, dtype=torch.float64)
        elif kind == "sink_dropout":
            kwargs.update(learnable_sink=torch.zeros(2, device=DEVICE), dropout_p=0.1)
        elif kind == "big_v_head":
            v = torch.randn(1, 16, 2, 288, device=DEVICE, dtype=torch.float16)
        elif kind == "device_mix":
            if DEVICE == "cpu":
                kwargs["alibi_slopes"] = torch.rand(2, dtype=torch.float64)
            else:
                k = k.cpu()
        if kind in ("cu_dtype", "cu_len"):
            cu = torch.tensor([0, 8, 16], device=DEVICE, dtype=torch.int64 if kind == "cu_dtype" else torch.int32)
            if kind == "cu_len":
                cu = cu[:, None]
            return flashattn2.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8)
        return flashattn2.flash_attn_func(q, k, v, **kwargs)

    return f"invalid {kind}", run


def _invalid_inference_case(rng: random.Random) -> tuple[str, callable]:
    """One bad argument on an otherwise valid flash_attn_with_kvcache (dense, paged or a latent cache) or
    flash_attn_combine call."""
    kind = rng.choice(("kv_seqlens_dtype", "kv_seqlens_len", "kv_table_dtype", "kv_page_size", "kv_v_wider",
                       "kv_latent_append", "kv_latent_dim", "kv_latent_fp8", "kv_rotary_shape", "kv_sink_shape",
                       "kv_heads", "combine_rank", "combine_lse", "combine_dtype"))

    def run():
        dt = torch.bfloat16
        if kind.startswith("combine"):
            out_p = torch.randn(3, 1, 4, 2, 32, device=DEVICE)
            lse_p = torch.randn(3, 1, 4, 2, device=DEVICE)
            if kind == "combine_rank":
                out_p = out_p[0]
            elif kind == "combine_lse":
                lse_p = lse_p[:, :, :3]
            else:
                out_p = out_p.to(torch.float64)
            return flashattn2.flash_attn_combine(out_p, lse_p)
        latent = kind.startswith("kv_latent")
        d, dv = (576, 512) if latent else (64, 64)
        q = torch.randn(2, 1, 4, d, device=DEVICE, dtype=dt)
        k_cache = torch.randn(2, 64, 1 if latent else 2, d, device=DEVICE, dtype=dt)
        v_cache = k_cache[..., :dv] if latent else torch.randn_like(k_cache)
        seqlens = torch.tensor([10, 40], device=DEVICE, dtype=torch.int32)
        kwargs = dict(cache_seqlens=seqlens)
        if kind == "kv_seqlens_dtype":
            kwargs["cache_seqlens"] = seqlens.long()
        elif kind == "kv_seqlens_len":
            kwargs["cache_seqlens"] = seqlens[:1]
        elif kind in ("kv_table_dtype", "kv_page_size"):
            k_cache, v_cache = (torch.randn(8, 16, 2, d, device=DEVICE, dtype=dt) for _ in range(2))
            table = torch.arange(8, device=DEVICE, dtype=torch.int32).view(2, 4)
            if kind == "kv_table_dtype":
                table = table.long()
            else:
                v_cache = torch.randn(16, 8, 2, d, device=DEVICE, dtype=dt)
            kwargs["block_table"] = table
        elif kind == "kv_v_wider":
            v_cache = torch.randn(2, 64, 2, 2 * d, device=DEVICE, dtype=dt)
        elif kind == "kv_latent_append":
            kwargs.update(k=torch.randn(2, 1, 1, d, device=DEVICE, dtype=dt),
                          v=torch.randn(2, 1, 1, dv, device=DEVICE, dtype=dt))
        elif kind == "kv_latent_dim":
            q, k_cache = q[..., :520], torch.randn(2, 64, 1, 520, device=DEVICE, dtype=dt)
            v_cache = k_cache[..., :512]
        elif kind == "kv_latent_fp8":
            q, k_cache = q.to(torch.float8_e4m3fn), k_cache.to(torch.float8_e4m3fn)
            v_cache = k_cache[..., :dv]
        elif kind == "kv_rotary_shape":
            kwargs.update(k=torch.randn(2, 1, 2, d, device=DEVICE, dtype=dt), v=torch.randn(2, 1, 2, d, device=DEVICE,
                                                                                           dtype=dt),
                          rotary_cos=torch.randn(64, 7, device=DEVICE, dtype=dt),
                          rotary_sin=torch.randn(64, 7, device=DEVICE, dtype=dt))
        elif kind == "kv_sink_shape":
            kwargs["learnable_sink"] = torch.zeros(3, device=DEVICE)
        elif kind == "kv_heads":
            k_cache, v_cache = (torch.randn(2, 64, 3, d, device=DEVICE, dtype=dt) for _ in range(2))
        return flashattn2.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)

    return f"invalid {kind}", run


def run_cases(seed: int, cases: int, mode: str, max_len: int, only: int | None = None,
              verbose: bool = False, time_limit: float | None = None, progress: int = 0, pool: int | None = None,
              shard: tuple[int, int] = (0, 1), first: int = 0, only_family: str | None = None) -> tuple[list[str], int]:
    """Run `cases` cases of a seed (stopping early past time_limit seconds); returns (the failures, one
    reproducer line each, printed as they happen; the number of cases run). pool: each case takes what
    decides its compiled kernels (entry point, dtype, head dim, options) from one of `pool` drawn templates and
    only its lengths and values of its own, so that a long run compiles a bounded set of variants. shard (w, n):
    this process runs cases i with i % n == w (n processes compile in parallel). first: the first case's index
    (a later run goes on where an earlier one stopped). only_family: run only the valid cases drawn from that family
    (e.g. "latent" for _latent_case), the others skipped with their numbers kept."""
    failures, ran, start = [], 0, time.monotonic()
    for i in [only] if only is not None else range(first, first + cases):
        if only is None and i % shard[1] != shard[0]:
            continue
        if time_limit is not None and time.monotonic() - start > time_limit:
            break
        rng = lrng = random.Random(f"{seed}-{i}")
        torch.manual_seed(rng.randrange(2 ** 31))
        if pool:
            rng = random.Random(f"{seed}-template-{lrng.randrange(pool)}")
        if mode == "invalid":
            desc, run = _invalid_case(rng)
            # the inference entry points, from a generator of their own: every earlier case keeps its draws
            family = random.Random(f"{seed}-{i}-family")
            if family.random() < 0.3:
                desc, run = _invalid_inference_case(family)
        else:
            make = rng.choice((_dense_case, _dense_case, _varlen_case, _kvcache_case, _flex_case))
            # the later families, from a generator of their own: every earlier case keeps its draws
            family = random.Random(f"{seed}-{i}-family")
            if family.random() < 0.2:
                make = family.choice((_combine_case, _fp8_case))
            # MLA's latent cache, from a generator of its own too
            if random.Random(f"{seed}-{i}-latent").random() < 0.05:
                make = _latent_case
            if only_family is not None and make.__name__ != f"_{only_family}_case":
                continue
            desc, run = make(rng, lrng, max_len, rng.random() < 0.5)
        if progress and ran and ran % progress == 0:
            print(f"{ran} cases, {len(failures)} failures, {time.monotonic() - start:.0f} s", flush=True)
        ran += 1
        pooled = f" --pool {pool}" if pool else ""
        repro = f"python scripts/fuzz.py --mode {mode} --seed {seed} --max-len {max_len}{pooled} --only {i}  # {desc}"
        if verbose:
            print(repro, flush=True)
        if DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()
        lenient = len(LENIENT)
        try:
            result = run()
            if len(LENIENT) > lenient:
                print("LENIENT", repro, "|", "; ".join(LENIENT[lenient:]), flush=True)
                LENIENT[lenient:] = [f"{repro}: {'; '.join(LENIENT[lenient:])}"]
        except NAMED as e:
            del LENIENT[lenient:]  # a failed case is a failure, whatever else it passed
            if mode != "invalid":
                _fail(failures, f"{repro}: {type(e).__name__}: {e}")
            continue
        except Exception as e:  # noqa: BLE001 - every other error is a finding
            del LENIENT[lenient:]
            _fail(failures, f"{repro}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
            continue
        if mode == "invalid":
            _fail(failures, f"{repro}: no error raised (returned {type(result).__name__})")
        if DEVICE == "cuda":
            _release(repro)
    return failures, ran


# a case whose peak exceeds this is named (the shards share one GPU: a hog starves the others)
PEAK_NOTE_BYTES = 4 << 30
RELEASE_BYTES = 2 << 30


def _release(repro: str) -> None:
    """Hand cached blocks back to the driver once they pass RELEASE_BYTES: the allocators of parallel shards
    otherwise keep what their largest case took, and the GPU runs out for everyone (seed 6: 34 out-of-memory
    errors in one shard). Not after every case: seed 7 did so and drew 4,637 cases in 300 s on 12 shards, against
    seed 6's 28,662 in 440 s on 14 (compiles included in both)."""
    peak = torch.cuda.max_memory_allocated()
    if peak > PEAK_NOTE_BYTES:
        print(f"peak {peak / 2 ** 30:.1f} GiB: {repro}", flush=True)
    if torch.cuda.memory_reserved() > RELEASE_BYTES:
        torch.cuda.empty_cache()


def _fail(failures: list[str], line: str) -> None:
    # printed at once: a run cut by a time limit outside keeps what it found
    print("FAIL", line, flush=True)
    failures.append(line)


def main() -> int:
    global RULE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("valid", "invalid"), default="valid")
    ap.add_argument("--rule", choices=("flash_attn", "fa2"), default=RULE,
                    help="the pass rule: flash_attn's of either generation (FA2's, or FA3/FA4's with its rounding "
                    "allowance), or FA2's alone")
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-len", type=int, default=300 if DEVICE == "cpu" else 4096)
    ap.add_argument("--only", type=int, default=None, help="rerun case N of the seed")
    ap.add_argument("--verbose", action="store_true", help="print each case before it runs")
    ap.add_argument("--time-limit", type=float, default=None, help="stop drawing cases after this many seconds")
    ap.add_argument("--progress", type=int, default=0, help="print a count every N cases")
    ap.add_argument("--pool", type=int, default=None,
                    help="draw each case's kernel variant from N templates (a bounded set of compiles)")
    ap.add_argument("--first", type=int, default=0, help="start at case N (go on after an earlier run)")
    ap.add_argument("--shard", default="0/1", help="W/N: run the cases i with i %% N == W")
    ap.add_argument("--family", default=None, help="valid mode: only the cases of one family (dense, varlen, "
                    "kvcache, flex, combine, fp8, latent); case numbers stay those of the full run")
    args = ap.parse_args()
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("no CUDA GPU: run with TRITON_INTERPRET=1 for the CPU interpreter", file=sys.stderr)
        return 2
    RULE = args.rule
    shard = tuple(int(x) for x in args.shard.split("/"))
    if DEVICE == "cuda" and shard[1] > 1:
        # each shard its share of the GPU: one that needs more fails its own case (named), not its neighbours'
        torch.cuda.set_per_process_memory_fraction(0.9 / shard[1])
    failures, ran = run_cases(args.seed, args.cases, args.mode, args.max_len, args.only, args.verbose,
                              args.time_limit, args.progress, args.pool, shard, args.first, args.family)
    print(f"{args.mode}: {ran} cases, {len(failures)} failures by rule {RULE} (seed {args.seed}, device {DEVICE}); "
          f"{len(LENIENT)} cases passed by FA3/FA4's rule or FlexAttention's error alone")
    if failures:
        # how many a looser reading would pass: FA3/FA4's rule, or the Delta-from-rounded-out baseline
        fa3 = sum("FA3/FA4's rule" in f and f.split("allowance")[1].split(")")[0].endswith("yes") for f in failures)
        delta = sum("larger baseline: yes" in f for f in failures)
        print(f"of the failures: {fa3} within FA3/FA4's rounding allowance, {delta} within {BWD} x the "
              "Delta-from-rounded-out baseline")
        oom = sum(": OutOfMemoryError:" in f for f in failures)
        if oom and shard[1] > 1:  # the cap is the harness's (0.9 / shards of the GPU): rerun those alone
            print(f"{oom} out of memory under the shard's cap of 0.9/{shard[1]} of the GPU: rerun each with --only")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
