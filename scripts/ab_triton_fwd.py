"""A/B of the Triton forward's tile configs, interleaved: each round times every candidate (and cuDNN) in turn,
alternating the order, so that clocks and heat fall on all of them alike (one-shot sweeps of the same config
have read 0.365 and 0.401 ms in two runs).

    PYTHONPATH=src python scripts/ab_triton_fwd.py --hdim 64 --causal --seqlens 2048 4096 \
        --configs "128,64,8,3;64,64,4,3" --rounds 8 --out FILE.json

bf16, 16k tokens a batch, hidden 2048 (scripts/sweep_configs.make_problem); --fp8 casts q, k, v to e4m3 (the package
call then takes them too; cuDNN keeps bf16), --softcap sets one (cuDNN, which has none, runs without). Prints each
candidate's median ms and its time over the first candidate's.
"""

import argparse
import dataclasses
import functools
import statistics

import torch
import triton
from result_rows import write_rows
from sweep_configs import _sdpa, make_problem
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn2
from flashattn2.kernels.portable.configs import FwdConfig
from flashattn2.kernels.portable.forward import forward_plan
from flashattn2.reference import attention_ref


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--configs", required=True,
                    help="'M,N,W,S[,TMA[,ONE_LOOP]];...' (BLOCK_M, BLOCK_N, warps, stages, then 0/1: tensor "
                    "descriptors, FwdConfig.one_loop)")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cands = [FwdConfig(*(int(x) for x in c.split(","))) for c in args.configs.split(";")]
    cands = [dataclasses.replace(c, use_tma=bool(c.use_tma)) for c in cands]
    rows = []
    for seqlen in args.seqlens:
        q, k, v, _, opts, flops = make_problem(args.hdim, args.causal, seqlen)
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        opts = opts._replace(softcap=args.softcap)
        descales, fp8_args = (None, None, None), {}
        if args.fp8:
            q, k, v = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
            descales = tuple(torch.ones(q.shape[0], k.shape[2], device=q.device) for _ in range(3))
            fp8_args = dict(zip(("q_descale", "k_descale", "v_descale"), descales, strict=True))
        if args.softcap:
            ref = attention_ref(*(x.to(torch.bfloat16) for x in (q, k, v)), causal=args.causal,
                                softcap=args.softcap)[0].float()
        else:  # FP8's values exactly in bf16
            ref = _sdpa(*(x.to(torch.bfloat16) for x in (q, k, v)), args.causal).float()
        fns = {}
        for cfg in cands:
            name = (",".join(str(int(x)) for x in dataclasses.astuple(cfg)[:4]) + (",tma" if cfg.use_tma else "")
                    + (",one-loop" if cfg.one_loop else ""))
            fns[name] = functools.partial(forward_plan(q, k, v, opts, False, cfg), q, k, v, opts, descales)
            try:
                err = (fns[name]()[0].float() - ref).abs().max().item()
            except triton.runtime.errors.OutOfResources as e:  # a tile too large for shared memory: left out
                print(f"s{seqlen}: {name} left out: {e}", flush=True)
                del fns[name]
                continue
            assert err < (0.1 if args.fp8 else 3e-2), (name, err)  # NaN fails too; FP8 rounds P to e4m3 too
        # the package's own call (flash_attn_func under auto), to see the table's choice through the front door
        fns["package"] = functools.partial(flashattn2.flash_attn_func, q, k, v, causal=args.causal,
                                           softcap=args.softcap, **fp8_args)
        # cuDNN on its own (batch, heads, seqlen, dim) layout, as the package bench runs it (on transposed views it
        # ran 3% slower at 2k)
        fns["cudnn"] = functools.partial(torch.nn.functional.scaled_dot_product_attention, qt, kt, vt,
                                         is_causal=args.causal)
        times = {n: [] for n in fns}
        for r in range(args.rounds):
            for name, fn in (reversed if r % 2 else iter)(list(fns.items())):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    times[name].append(triton.testing.do_bench(fn, warmup=10, rep=50))
        med = {n: statistics.median(t) for n, t in times.items()}
        first = next(iter(med.values()))
        print(f"s{seqlen}: " + "  ".join(f"{n} {t:.4f} ms ({t / first:.3f})" for n, t in med.items()), flush=True)
        rows.append(dict(seqlen=seqlen, ms=times, median=med, tflops={n: flops / t / 1e9 for n, t in med.items()}))
    if args.out:
        write_rows(args.out, rows, hdim=args.hdim, causal=args.causal, fp8=args.fp8, softcap=args.softcap)


if __name__ == "__main__":
    main()
