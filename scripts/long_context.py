"""Long sequences on one GPU: causal forward+backward at batch 1, 16 heads of 128 (hidden 2048), from 128k to
1M tokens (1M = 2**20 rows x 2048 elements = 2**31: the kernels' 64-bit row offsets), with the time, TFLOP/s and
peak memory per token (constant when memory is linear in length); the last rows of head 0 are checked against a
float64 reference. Then the cost the 64-bit variant would have if it were always on, at 16k tokens.

    PYTHONPATH=src python scripts/long_context.py --out-dir DIR
"""

import argparse
import datetime
import json
import time
from pathlib import Path

import torch
import triton
import triton.testing

import flashattn2
from flashattn2 import attention_ref, flash_attn_func
from flashattn2.kernels import backends, common
from flashattn2.kernels.portable import backward, forward

HEADS, DIM = 16, 128


def inputs(seqlen: int, heads: int = HEADS):
    torch.manual_seed(seqlen)
    return [torch.randn(1, seqlen, heads, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)]


def fwd_bwd(q, k, v, dout):
    out = flash_attn_func(q, k, v, causal=True)
    return out, *torch.autograd.grad(out, (q, k, v), dout)


def check_last_rows(q, k, v, dout, out, dq, rows: int = 32) -> dict:
    """out and dq of the last rows of head 0 against float64 (both depend on those rows alone)."""
    qs = q.detach()[:, -rows:, :1].double().requires_grad_()
    ks, vs = (x.detach()[:, :, :1].double().requires_grad_() for x in (k, v))
    ref, _ = attention_ref(qs, ks, vs, causal=True)
    (dq_ref,) = torch.autograd.grad(ref, qs, dout[:, -rows:, :1].double())
    err = lambda a, b: (a.double() - b).abs().max().item()  # noqa: E731
    return {"out_max_err": err(out[:, -rows:, :1], ref), "dq_max_err": err(dq[:, -rows:, :1], dq_ref),
            "out_ref_max": ref.abs().max().item()}


def long_run(seqlen: int) -> dict:
    q, k, v = inputs(seqlen)
    dout = torch.randn_like(q)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    out, dq, dk, dv = fwd_bwd(q, k, v, dout)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - base  # beyond q, k, v and dout
    flops = 4 * seqlen * seqlen * HEADS * DIM / 2 * 3.5  # causal: half; fwd 1 + bwd 2.5
    row = {"seqlen": seqlen, "long_rows": common.long_rows(1, q), "seconds": seconds,
           "tflops": flops / seconds / 1e12, "peak_extra_gib": peak / 2**30,
           "peak_extra_bytes_per_token": peak / seqlen,
           "finite": all(bool(torch.isfinite(x).all()) for x in (out, dq, dk, dv)),
           **check_last_rows(q, k, v, dout, out, dq)}
    print(json.dumps(row), flush=True)
    return row


def variant_cost(seqlen: int = 16384) -> dict:
    """fwd+bwd ms at hidden 2048 with 32-bit and with forced 64-bit row offsets (the shapes pick 32-bit)."""
    batch = 16384 // seqlen
    q, k, v = (torch.randn(batch, seqlen, HEADS, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    previous = backends.get_backend()
    flashattn2.set_backend("triton")  # Gluon declines long rows: compare Triton with Triton
    ms = {}
    for name in ("32-bit", "64-bit", "32-bit again"):
        forced = name == "64-bit"
        forward.long_rows = backward.long_rows = (lambda *a: True) if forced else common.long_rows
        flashattn2.set_backend("triton")  # drops remembered plans
        ms[name] = triton.testing.do_bench(lambda: fwd_bwd(q, k, v, dout), warmup=50, rep=300,
                                           return_mode="median")
    forward.long_rows = backward.long_rows = common.long_rows
    flashattn2.set_backend(previous)
    row = {"seqlen": seqlen, "batch": batch, **{f"ms_{k}": v for k, v in ms.items()}}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out-dir", default="benchmarks/results")
    p.add_argument("--seqlens", type=int, nargs="+", default=[2**17, 2**18, 2**19, 2**20])
    args = p.parse_args()
    warm = inputs(4096), torch.randn(1, 4096, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    fwd_bwd(*warm[0], warm[1])  # compile both variants before anything is timed
    forward.long_rows = backward.long_rows = lambda *a: True
    flashattn2.set_backend(backends.get_backend())
    fwd_bwd(*warm[0], warm[1])
    forward.long_rows = backward.long_rows = common.long_rows
    flashattn2.set_backend(backends.get_backend())
    backend = backends.get_backend()
    rows = [long_run(s) for s in args.seqlens]
    cost = variant_cost()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "heads": HEADS, "head_dim": DIM, "dtype": "bfloat16", "causal": True, "backend": backend}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    day = meta["date_utc"][:10]
    (out / f"{day}_long_context.json").write_text(json.dumps({"meta": meta, "runs": rows, "variant": cost},
                                                             indent=1))
    lines = [f"# Causal forward+backward at batch 1, {HEADS} heads of {DIM}, bf16", "",
             *(f"- {k}: {v}" for k, v in meta.items()), "",
             "| tokens | 64-bit rows | seconds | TFLOP/s | peak GiB beyond q,k,v,dout | bytes/token | "
             "out err (last rows) | dq err |", "|---:|:-:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seqlen']:,} | {'yes' if r['long_rows'] else 'no'} | {r['seconds']:.2f} | {r['tflops']:.0f} | "
              f"{r['peak_extra_gib']:.2f} | {r['peak_extra_bytes_per_token']:.0f} | {r['out_max_err']:.2e} | "
              f"{r['dq_max_err']:.2e} |" for r in rows]
    lines += ["", f"64-bit row offsets forced at {cost['seqlen']} tokens x {cost['batch']} (fwd+bwd, ms, Triton): "
              + ", ".join(f"{k[3:]} {v:.3f}" for k, v in cost.items() if k.startswith("ms_"))]
    (out / f"{day}_long_context.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
