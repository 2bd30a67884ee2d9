"""Time candidate tile configurations of the forward and backward kernels on the GPU.

    PYTHONPATH=src python scripts/sweep_configs.py [--seqlen 4096] [--hdims 64 128 256] [--out FILE]

bf16, 16k tokens per batch, hidden 2048 (the paper's setup). Prints TFLOP/s per candidate and the best
per (head dim, causal); the winners go into src/flashattn2/kernels/configs.py by hand, with the run
recorded in benchmarks/NOTES.md.
"""

import argparse
import json
import time

import torch
import triton.testing

from flashattn2.interface import _fwd_op
from flashattn2.kernels.backward import attention_backward
from flashattn2.kernels.configs import BwdConfig, FwdConfig
from flashattn2.kernels.forward import attention_forward

FWD = {
    64: [(128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 4, 3),
         (64, 64, 4, 3)],
    128: [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3),
          (128, 32, 4, 3)],
    256: [(64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 2), (128, 32, 8, 2), (64, 64, 8, 2)],
}
# dK/dV kernel (block_m, block_n, warps, stages); dQ kernel likewise
DKDV = {
    64: [(64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 2)],
    128: [(64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 2), (32, 64, 4, 2), (64, 128, 8, 3)],
    256: [(32, 64, 8, 1), (32, 64, 4, 2), (16, 64, 4, 2), (32, 32, 4, 2), (64, 64, 8, 1)],
}
DQ = {
    64: [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3), (64, 128, 8, 2)],
    128: [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3), (64, 128, 8, 2)],
    256: [(64, 32, 4, 2), (32, 64, 4, 2), (64, 64, 8, 1)],
}


def _try(record, fn, check):
    """Run, check and time fn(); a candidate that fails to compile or run is recorded, not fatal."""
    try:
        record["err"] = check(fn())
        record["ms"] = triton.testing.do_bench(fn, warmup=20, rep=60, return_mode="median")
        record["tflops"] = record["flops"] / record["ms"] / 1e9
    except Exception as exc:  # out of shared memory, compile failure
        record["error"] = str(exc)[:200]
    del record["flops"]
    print(json.dumps(record), flush=True)
    return record


def sweep_shape(hdim, causal, seqlen):
    batch, nheads = 16384 // seqlen, 2048 // hdim
    q, k, v, dout = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    scale = hdim**-0.5
    fwd_flops = 4 * batch * nheads * seqlen * seqlen * hdim / (2 if causal else 1)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
    results = []
    for cand in FWD[hdim]:
        cfg = FwdConfig(*cand)
        rec = {"kind": "fwd", "hdim": hdim, "causal": causal, "cfg": cand, "flops": fwd_flops}
        results.append(_try(rec, lambda cfg=cfg: attention_forward(q, k, v, scale, causal, cfg),
                            lambda res: (res[0].float() - ref.float()).abs().max().item()))
    out, lse = _fwd_op(q, k, v, scale, causal, False)
    dq_det = attention_backward(dout, q, k, v, out, lse, scale, causal, True)[0].float()
    for dkdv in DKDV[hdim]:
        for cfg in [BwdConfig(*dkdv, *DQ[hdim][0], True)] + [BwdConfig(*dkdv, *dq, False) for dq in DQ[hdim]]:
            rec = {"kind": "bwd", "hdim": hdim, "causal": causal, "flops": 2.5 * fwd_flops,
                   "cfg": [*dkdv, cfg.dq_block_m, cfg.dq_block_n, cfg.dq_num_warps, cfg.dq_num_stages,
                           cfg.atomic_dq]}
            results.append(_try(
                rec, lambda cfg=cfg: attention_backward(dout, q, k, v, out, lse, scale, causal, False, cfg),
                lambda res: (res[0].float() - dq_det).abs().max().item()))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--hdims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    t0 = time.time()
    results = [r for hdim in args.hdims for causal in (False, True)
               for r in sweep_shape(hdim, causal, args.seqlen)]
    print(f"\nsweep took {time.time() - t0:.0f} s\n")
    for kind in ("fwd", "bwd"):
        for hdim in args.hdims:
            for causal in (False, True):
                ok = [r for r in results
                      if (r["kind"], r["hdim"], r["causal"]) == (kind, hdim, causal) and "tflops" in r]
                for r in sorted(ok, key=lambda r: -r["tflops"])[:3]:
                    print(f"{kind} d={hdim} causal={int(causal)} {r['cfg']} {r['tflops']:.0f} TFLOP/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "seqlen": args.seqlen, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
