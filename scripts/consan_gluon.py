"""Triton's concurrency sanitizer (ConSan) over the Gluon forward and backward kernels on a few shapes: it
instruments every shared-memory access, barrier and async copy and stops the kernel on a race or a barrier misuse.
Run on an sm_90 GPU:
  python scripts/consan_gluon.py [bwd [N] | latent [paged] [KEY=VALUE+...] | persistent | two | fp8 [N] | mla |
                                  sinks-mla | flex | mla-pass fwd|bwd [sink] [KEY=VALUE+...]]
(bwd: the backward alone, its forward on Triton; latent: the latent-cache decoding kernel (paged: over a shuffled page
table), with a LATENT_TUNING over its defaults such as VALUE_WGS=2+SCORE_WGS=2; persistent: only the forward shape whose
programs loop over several work items, the slowest under ConSan; two: d64 forwards with two programs per SM,
CTAS_PER_SM=2; fp8: FP8 forwards on the persistent grid; N: only that shape of bwd's or fp8's list, so that shapes can
run side by side; mla, sinks-mla, flex: scripts/sanitize.py's family of that name; mla-pass: one pass of the 192/128
kernels on a small shape, MLA_SEQLEN tokens)"""

import os
import sys

os.environ["TRITON_INSTRUMENTATION_MODE"] = "consan"  # read when a kernel compiles

import torch  # noqa: E402
import triton  # noqa: E402

import flashattn2  # noqa: E402
from flashattn2 import flash_attn_func  # noqa: E402

# ConSan keeps its state in a scratch buffer that the launcher asks torch for
triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
# the allocator is per thread: run the backward on this thread, not on autograd's device thread
torch.autograd.set_multithreading_enabled(False)

SHAPES = [
    # batch, seqlen, heads, head_dim, causal: the last two have more work items than SMs (persistent loop)
    (1, 300, 2, 128, True),
    (1, 513, 2, 128, False),
    (2, 1024, 8, 64, False),
    (1, 256, 160, 128, False),  # 320 short work items: each program loops over two or three
    (1, 257, 2, 256, True),
]

# the backward with dQ fused (both head dims, GQA, a cut last tile) and the deterministic dK/dV-only kernel
BWD_SHAPES = [
    # batch, seqlen, heads, kv heads, head_dim, causal, deterministic
    (1, 200, 4, 2, 128, True, False),
    (2, 130, 2, 2, 64, False, False),
    (1, 200, 2, 2, 128, True, True),
]

# the families of scripts/sanitize.py that run Gluon kernels no mode above reaches: the 192/128 forward and
# backward (128-key items), with a learnable sink, and flex_attention's block-sparse mode; each checks its result
# against the float64 reference
FAMILIES = {"mla": "mla_gluon", "sinks-mla": "sinks_mla", "flex": "flex"}
if sys.argv[1:] and sys.argv[1] in FAMILIES:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sanitize  # noqa: E402

    torch.manual_seed(0)
    getattr(sanitize, FAMILIES[sys.argv[1]])()
    torch.cuda.synchronize()
    print(f"consan clean ({sys.argv[1]}: scripts/sanitize.py's {FAMILIES[sys.argv[1]]})", flush=True)
    sys.exit(0)


def gluon_against_triton(inputs, dout, part="bwd", **kwargs) -> float:
    """flash_attn_func(q, k, v, **kwargs) with one pass (part: fwd or bwd) on the Gluon kernels, then on Triton's,
    the other pass on Triton's both times (so that only the pass under test runs Gluon under ConSan): the largest
    difference of the two runs' outputs, or of their gradients of `inputs` (q, k, v and any tensor among kwargs)."""
    results = {}
    for backend in ("gluon", "triton"):
        flashattn2.set_backend(backend if part == "fwd" else "triton")
        out = flash_attn_func(*inputs[:3], **kwargs)
        flashattn2.set_backend(backend)
        results[backend] = (out,) if part == "fwd" else torch.autograd.grad(out, inputs, dout)
        torch.cuda.synchronize()
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(*results.values(), strict=True))


# "mla-pass fwd|bwd [sink]": one pass of the 192/128 Gluon kernels on a small shape (one kv head, a cut tile), the
# other pass on Triton, so that the forward and the backward under ConSan can run side by side
if sys.argv[1:2] == ["mla-pass"]:
    import time

    part, with_sink = sys.argv[2], "sink" in sys.argv[3:]
    # KEY=VALUE (joined with +): the backward's CONFIGS_MLA entry changed, e.g. STAGES=2, whose instrumented build
    # ptxas finishes (10 MB of PTX, 4 CPU-minutes at -O1) where the default's three stages (18.7 MB) ran past 26
    # minutes on the device (benchmarks/NOTES.md, seventeenth session)
    from flashattn2.kernels.sm90 import backward as bwd_sm90

    for item in (x for arg in sys.argv[3:] if "=" in arg for x in arg.split("+")):
        key, value = item.split("=")
        bwd_sm90.CONFIGS_MLA[(192, 128)] = dict(bwd_sm90.CONFIGS_MLA[(192, 128)], **{key: int(value)})
    n = int(os.environ.get("MLA_SEQLEN", "130"))  # the backward under ConSan takes minutes per tile
    torch.manual_seed(0)
    q = torch.randn(1, n, 2, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, n, 1, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, n, 1, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    sink = torch.randn(2, device="cuda", requires_grad=True) if with_sink else None
    dout = torch.randn(1, n, 2, 128, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    err = gluon_against_triton((q, k, v) + ((sink,) if with_sink else ()), dout, part, causal=True,
                               learnable_sink=sink)
    print(f"consan clean (192/128 {part}, sink={with_sink}, {bwd_sm90.CONFIGS_MLA[(192, 128)]}): b1 s{n} h2/1 "
          f"causal, max |gluon - triton| {err:.2e}, {time.time() - t0:.0f} s", flush=True)
    sys.exit(0)

# "bwd N" / "fp8 N": only shape N of the mode's list, so that its shapes can run side by side
ONLY = [int(sys.argv[2])] if len(sys.argv) > 2 and sys.argv[1] in ("bwd", "fp8") else None

if sys.argv[1:2] == ["latent"]:
    from flashattn2 import flash_attn_with_kvcache
    from flashattn2.kernels.sm90 import latent

    args = sys.argv[2:]
    paged = "paged" in args  # the cache in 64-row pages, shuffled
    tuning = [a for a in args if a != "paged"]
    from tuning_spec import parse

    latent.LATENT_TUNING = dict(latent.LATENT_TUNING, **parse(tuning[0] if tuning else "", latent.LATENT_TUNING))

    torch.manual_seed(0)
    cache = torch.randn(2, 256, 1, 576, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.tensor([37, 200], device="cuda", dtype=torch.int32)
    q = torch.randn(2, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    table = None
    if paged:
        order = torch.randperm(8, device="cuda")
        cache = cache.reshape(8, 64, 1, 576)[torch.argsort(order)]  # batch b's page p at slot order[4b + p]
        table = order.reshape(2, 4).to(torch.int32)
    for num_splits in (1, 3):
        results = {}
        for backend in ("gluon", "triton"):
            flashattn2.set_backend(backend)
            results[backend] = flash_attn_with_kvcache(q, cache, cache[..., :512], cache_seqlens=seqlens,
                                                       num_splits=num_splits, block_table=table)
            torch.cuda.synchronize()
        err = (results["gluon"].float() - results["triton"].float()).abs().max().item()
        print(f"consan clean (latent decoding{', paged' if paged else ''}, {latent.LATENT_TUNING}): "
              f"splits={num_splits}, max |gluon - triton| {err:.2e}", flush=True)
    sys.exit(0)

if sys.argv[1:2] == ["fp8"]:
    # FP8 forwards on the persistent grid, one query row and one key among them (a one-row FP8 stress case failed
    # once on the GPU and did not come back in 900 reruns: benchmarks/NOTES.md, tenth session)
    from flashattn2 import quantize_fp8
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    for name in ("CONFIGS", "CONFIGS_FP8"):
        setattr(fwd_sm90, name, {d: dict(c, PERSISTENT=True) for d, c in getattr(fwd_sm90, name).items()})
    fp8_shapes = ((1, 1, 1, 1, 64, False), (2, 1, 727, 4, 64, False), (2, 300, 77, 4, 64, True),
                  (1, 256, 256, 160, 128, False))
    for batch, seqlen_q, seqlen_k, heads, head_dim, causal in [fp8_shapes[i] for i in ONLY or range(len(fp8_shapes))]:
        torch.manual_seed(0)
        q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, seqlen_k, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        q8, k8, v8, *descales = quantize_fp8(q, k, v)
        results = {}
        for backend in ("gluon", "triton"):
            flashattn2.set_backend(backend)
            results[backend] = flash_attn_func(q8, k8, v8, causal=causal, q_descale=descales[0],
                                               k_descale=descales[1], v_descale=descales[2])
            torch.cuda.synchronize()
        err = (results["gluon"].float() - results["triton"].float()).abs().max().item()
        print(f"consan clean (FP8 forward): b{batch} s{seqlen_q}x{seqlen_k} h{heads} d{head_dim} causal={causal}, "
              f"max |gluon - triton| {err:.2e}", flush=True)
    sys.exit(0)

if sys.argv[1:] == ["persistent"]:
    SHAPES = [shape for shape in SHAPES if shape[2] == 160]

if sys.argv[1:] == ["two"]:
    # two programs per SM (forward.CTAS_PER_SM=2, 64-key tiles) at d64: causal on the schedule over 2 x SMs
    # programs, and non-causal with more items than programs
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    two = dict(CTAS_PER_SM=2, CONSUMERS=2, FREE_REGS=False, BLOCK_N=64, STAGES=2, Q_STAGES=1, SEPARATE_O=False,
               LAZY_O_WAIT=False, PERSISTENT_CAUSAL=True)
    fwd_sm90.CONFIGS = {**fwd_sm90.CONFIGS, 64: dict(fwd_sm90.CONFIGS[64], **two)}
    fwd_sm90.CONFIGS_CAUSAL = {d: c for d, c in fwd_sm90.CONFIGS_CAUSAL.items() if d != 64}
    fwd_sm90.CONFIGS_NONCAUSAL = {d: c for d, c in fwd_sm90.CONFIGS_NONCAUSAL.items() if d != 64}
    SHAPES = [(2, 1024, 8, 64, False), (1, 300, 2, 64, True), (1, 256, 300, 64, False), (1, 384, 120, 64, True)]

if sys.argv[1:2] == ["bwd"]:
    for batch, seqlen, heads, heads_k, head_dim, causal, deterministic in [BWD_SHAPES[i] for i in
                                                                           ONLY or range(len(BWD_SHAPES))]:
        torch.manual_seed(0)
        q = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(batch, seqlen, heads_k, head_dim, device="cuda", dtype=torch.bfloat16,
                            requires_grad=True) for _ in range(2))
        err = gluon_against_triton((q, k, v), torch.randn_like(q), causal=causal, deterministic=deterministic)
        print(f"consan clean (backward): b{batch} s{seqlen} h{heads}/{heads_k} d{head_dim} causal={causal} "
              f"deterministic={deterministic}, max |gluon - triton| {err:.2e}", flush=True)
    sys.exit(0)

for batch, seqlen, heads, head_dim, causal in SHAPES:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    results = {}
    for backend in ("gluon", "triton"):
        print(f"running {backend}: b{batch} s{seqlen} h{heads} d{head_dim} causal={causal}", flush=True)
        flashattn2.set_backend(backend)
        out = flash_attn_func(q, k, v, causal=causal)
        # the Gluon dK/dV kernel exists at head dim 128 only
        grads = torch.autograd.grad(out, (q, k, v), dout) if head_dim == 128 and seqlen <= 513 else ()
        torch.cuda.synchronize()
        results[backend] = (out, *grads)
    pairs = zip(results["gluon"], results["triton"], strict=True)
    err = max((a.float() - b.float()).abs().max().item() for a, b in pairs)
    what = "forward + backward" if len(results["gluon"]) > 1 else "forward"
    print(f"consan clean ({what}): b{batch} s{seqlen} h{heads} d{head_dim} causal={causal}, "
          f"max |gluon - triton| {err:.2e}", flush=True)
