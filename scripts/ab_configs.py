"""Interleaved A/B timing of two configurations of the same kernels (A, B, A, B on one GPU), so that
run-to-run drift shows up as the spread between the two A runs rather than as a difference.

    PYTHONPATH=src python scripts/ab_configs.py --what use_tma [--out FILE]

bf16, 16k tokens per batch, hidden 2048; the tuned config with one field switched off (A) and on (B).
"""

import argparse
import dataclasses
import json

import torch
import triton
import triton.testing
from sweep_configs import make_problem

from flashattn2.kernels.portable.backward import attention_backward
from flashattn2.kernels.portable.configs import bwd_config, fwd_config
from flashattn2.kernels.portable.forward import attention_forward


def ab_shape(what: str, hdim: int, causal: bool, seqlen: int) -> dict:
    q, k, v, dout, opts, flops = make_problem(hdim, causal, seqlen)
    fcur, bcur = fwd_config(hdim, causal, q.device), bwd_config(hdim, causal, q.device)
    out, lse, _ = attention_forward(q, k, v, opts)
    row = {"hdim": hdim, "causal": causal, "seqlen": seqlen}
    for run in ("A1", "B1", "A2", "B2"):
        on = run[0] == "B"
        fcfg = dataclasses.replace(fcur, **{what: on})
        bcfg = dataclasses.replace(bcur, **{what: on})
        fwd_ms = triton.testing.do_bench(lambda c=fcfg: attention_forward(q, k, v, opts, config=c),
                                         warmup=10, rep=50, return_mode="median")
        bwd_ms = triton.testing.do_bench(
            lambda c=bcfg: attention_backward(dout, q, k, v, out, lse, opts, config=c),
            warmup=10, rep=50, return_mode="median")
        row[f"fwd_{run}"] = round(flops / fwd_ms / 1e9, 1)
        row[f"bwd_{run}"] = round(2.5 * flops / bwd_ms / 1e9, 1)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", choices=["use_tma"], required=True)
    parser.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--causal", type=int, nargs="+", default=[1])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = [ab_shape(args.what, hdim, bool(causal), seqlen)
            for hdim in args.hdims for causal in args.causal for seqlen in args.seqlens]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "what": args.what, "off": "A", "on": "B", "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
