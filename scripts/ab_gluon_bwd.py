"""A/B of the Gluon backward's tunings (kernels/sm90/backward.py) inside the whole backward against the
all-Triton backward and cuDNN, interleaved per shape: python scripts/ab_gluon_bwd.py --out DIR
[--set KEY=VALUE ...]. Each variant's gradients are checked against Triton's first. "fused-..." variants
compute dQ in the kernel; "dkdv..." ones leave it to the Triton dQ kernel (the deterministic path)."""

import argparse
import json

import torch
import torch.nn.functional as F
import triton
from result_rows import write_rows
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn2
from flashattn2.kernels import backends
from flashattn2.kernels.params import AttnOptions
from flashattn2.kernels.portable import forward
from flashattn2.kernels.sm90 import backward as bwd_sm90

# the head dim's tunings in bwd_sm90 ("fused": CONFIGS, "dkdv": CONFIGS_DKDV), filled in by main()
VARIANTS = {}
ROUNDS = 1
# --try NAME:KEY=VALUE,...: the head dim's fused tuning with those keys changed, as variant "fused-NAME"
# (for example rows:DQ_ROWS=1 or m64-s3:BLOCK_M=64,STAGES=3)
# --extra: the options' cells (bf16 d128, 4k tokens unless named), name -> (causal, seqlen, kv heads, options)
EXTRA = {"softcap": (True, 4096, 16, dict(softcap=30.0)), "alibi": (True, 4096, 16, dict(alibi=True)),
         "gqa-8": (True, 4096, 2, {}), "window-512": (True, 16384, 16, dict(window_left=511))}


def measure(hdim: int, causal: bool, seqlen: int, dtype: torch.dtype, nheads_k: int | None = None,
            options: dict | None = None, name: str = "") -> dict:
    batch, nheads = 16384 // seqlen, 2048 // hdim
    nheads_k = nheads_k or nheads
    torch.manual_seed(0)
    q, dout = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=dtype) for _ in range(2))
    k, v = (torch.randn(batch, seqlen, nheads_k, hdim, device="cuda", dtype=dtype) for _ in range(2))
    options = dict(options or {})
    if options.pop("alibi", False):
        options["alibi_slopes"] = torch.rand(nheads, device="cuda") * 0.3
    opts = AttnOptions(softmax_scale=hdim ** -0.5, window_left=options.pop("window_left", -1),
                       window_right=0 if causal else -1, **options)
    out, lse, _ = forward.attention_forward(q, k, v, opts)
    # full-matrix FLOPs (a window's TFLOP/s are comparable between the kernels, not with other rows)
    flops = 2.5 * 4 * batch * nheads * seqlen * seqlen * hdim / (2 if causal else 1)
    row = dict(name=name, hdim=hdim, causal=causal, seqlen=seqlen, dtype=str(dtype)[6:], errors={})
    flashattn2.set_backend("triton")
    ref = backends.backward_plan(dout, q, k, v, out, lse, opts)
    ref_grads = ref(dout, q, k, v, out, lse, opts)
    fns = {"triton": lambda: ref(dout, q, k, v, out, lse, opts)}
    flashattn2.set_backend("gluon")
    saved = dict(bwd_sm90.CONFIGS)
    for name, tuning in VARIANTS.items():
        bwd_sm90.CONFIGS[hdim] = tuning
        flashattn2.set_backend("gluon")  # drops the plans made with the last tuning
        plan = backends.backward_plan(dout, q, k, v, out, lse, opts)
        assert plan.gluon is not None and plan.fused_dq == tuning["FUSED_DQ"]
        grads = plan(dout, q, k, v, out, lse, opts)
        errs = [(g.float() - r.float()).abs().max().item() for g, r in zip(grads, ref_grads, strict=True)]
        row["errors"][name] = errs
        if not all(e < 5e-2 for e in errs):  # NaN fails too
            print(f"WRONG {name} d{hdim} causal={causal} s{seqlen}: {errs}", flush=True)
            continue
        fns["gluon-" + name] = (lambda p: lambda: p(dout, q, k, v, out, lse, opts))(plan)
        if tuning["FUSED_DQ"]:
            # the kernel alone: without the dQ buffer's zeroing and conversion, and without the preprocess
            bufs = (torch.randn_like(lse), torch.zeros(q.shape, dtype=torch.float32, device="cuda"),
                    torch.empty_like(k), torch.empty_like(v))
            fns["kernel-" + name] = (lambda p, b: lambda: p.gluon(dout, q, k, v, lse, *b, opts))(plan, bufs)
    bwd_sm90.CONFIGS.clear()
    bwd_sm90.CONFIGS.update(saved)
    flashattn2.set_backend("auto")
    # cuDNN on the same shape, with GQA's kv heads repeated (SDPA's cuDNN path takes equal head counts)
    k, v = (x.repeat_interleave(nheads // nheads_k, dim=2) for x in (k, v))
    qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dot = dout.transpose(1, 2).contiguous()
        fns["cudnn"] = lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)
        # rounds in alternating order, best kept: on long shapes what runs later in a round runs on a warmer,
        # lower-clocked GPU (the variant measured last lost 4-7% at 16k in every A/B of 2026-11-24)
        for round_ in range(ROUNDS):
            for name, fn in (reversed if round_ % 2 else iter)(list(fns.items())):
                tflops = round(flops / triton.testing.do_bench(fn, warmup=25, rep=100) / 1e9, 1)
                row[name] = max(row.get(name, 0.0), tflops)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16"])
    ap.add_argument("--set", nargs="*", default=[], help="KEY=VALUE overrides of every variant's tuning")
    ap.add_argument("--extra", action="store_true", help="also the options' cells (EXTRA), bf16")
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--grid", action="store_true", help="also the fused kernel with one program per work item")
    ap.add_argument("--try", dest="tries", nargs="*", default=[],
                    help="NAME:KEY=VALUE,... variants of the fused tuning")
    ap.add_argument("--no-dkdv", action="store_true", help="leave out the deterministic (dK/dV-only) kernel")
    ap.add_argument("--rounds", type=int, default=1, help="alternating timing rounds per shape, best kept")
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    args = ap.parse_args()
    global ROUNDS
    ROUNDS = args.rounds
    VARIANTS["fused"] = dict(bwd_sm90.CONFIGS[args.hdim])
    if not args.no_dkdv:
        VARIANTS["dkdv"] = dict(bwd_sm90.CONFIGS_DKDV[args.hdim])
    if args.grid:
        VARIANTS["fused-grid"] = dict(bwd_sm90.CONFIGS[args.hdim], PERSISTENT=False)
    for kv in args.set:
        key, value = kv.split("=")
        for tuning in VARIANTS.values():
            tuning[key] = int(value)
    for spec in args.tries:
        name, changes = spec.split(":")
        VARIANTS["fused-" + name] = dict(bwd_sm90.CONFIGS[args.hdim], **{
            key: int(value) for key, value in (change.split("=") for change in changes.split(","))})
    rows = []
    for dtype in args.dtypes:
        for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]:
            for seqlen in args.seqlens:
                rows.append(measure(args.hdim, causal, seqlen, getattr(torch, dtype)))
                print(json.dumps(rows[-1]), flush=True)
    for name, (causal, seqlen, nheads_k, options) in EXTRA.items() if args.extra else ():
        rows.append(measure(args.hdim, causal, seqlen, torch.bfloat16, nheads_k, options, name))
        print(json.dumps(rows[-1]), flush=True)
    write_rows(f"{args.out}/ab_gluon_bwd.json", rows)


if __name__ == "__main__":
    main()
