"""Time candidate tile configurations of the forward and backward kernels on the GPU.

    PYTHONPATH=src python scripts/sweep_configs.py [--seqlen 4096 ...] [--hdims 128 64 256] [--out FILE]
        [--budget-s 500] [--modes fwd bwd] [--causal both|yes|no] [--extra] [--fwd-configs 'M,N,W,S[,1];...']

bf16, 16k tokens per batch, hidden 2048 (the paper's setup). Each candidate is checked against a
reference and timed; the dK/dV and dQ kernels are swept one at a time with the other kernel fixed at
its current configuration, and dK/dV also with dQ by bulk atomics instead of the dQ kernel. Results
are appended to --out after every candidate, so a run cut short keeps what it measured; candidates
left when the time budget runs out are skipped. The winners go into src/flashattn2/kernels/portable/configs.py
by hand, with the run recorded in benchmarks/NOTES.md.
"""

import argparse
import dataclasses
import json
import time

import torch
import triton
import triton.testing

from flashattn2.kernels.params import AttnOptions
from flashattn2.kernels.portable.backward import attention_backward
from flashattn2.kernels.portable.configs import BwdConfig, FwdConfig, bwd_config, fwd_config
from flashattn2.kernels.portable.forward import attention_forward

# (BLOCK_M, BLOCK_N, warps, stages[, tensor descriptors]); plus the current config without descriptors
FWD = {
    64: [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3), (128, 128, 8, 2)],
    128: [(128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 8, 2)],
    256: [(128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2)],
}
# --extra: more forward candidates for the short and causal cells (issue 29)
FWD_EXTRA = {
    64: [(128, 64, 8, 4), (128, 64, 8, 3, True), (128, 128, 8, 3, True), (64, 128, 4, 3), (128, 32, 4, 3),
         (64, 32, 4, 4), (128, 128, 4, 3), (64, 64, 4, 3, True), (64, 64, 4, 4), (64, 64, 4, 2), (64, 32, 4, 3),
         (64, 64, 8, 3)],
    128: [(128, 64, 8, 4), (128, 128, 8, 3, True), (64, 64, 4, 3, True), (128, 32, 4, 3), (64, 128, 4, 3)],
    256: [(128, 64, 8, 2, True), (64, 64, 4, 3), (128, 32, 4, 2)],
}
DKDV = {
    64: [(64, 128, 8, 2), (32, 128, 8, 2), (64, 64, 8, 2), (64, 64, 4, 2), (32, 128, 4, 3)],
    128: [(64, 64, 8, 2), (64, 128, 8, 2), (32, 128, 8, 2), (64, 64, 4, 2), (32, 64, 4, 2)],
    256: [(64, 64, 8, 1), (32, 64, 8, 1), (32, 64, 4, 2), (64, 64, 8, 2), (32, 128, 8, 1)],
}
DQ = {
    64: [(128, 64, 8, 2), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 8, 2)],
    128: [(64, 64, 4, 2), (128, 64, 8, 2), (64, 128, 8, 2), (128, 32, 4, 3)],
    256: [(64, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2), (64, 64, 8, 1)],
}


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.time() + seconds

    def left(self) -> bool:
        return time.time() < self.deadline


def _try(record, fn, check, out, budget):
    """Run, check and time fn(); a candidate that fails to compile or run is recorded, not fatal."""
    if not budget.left():
        return None
    t0 = time.time()
    try:
        record["err"] = check(fn())
        record["first_s"] = round(time.time() - t0, 2)
        record["ms"] = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
        record["tflops"] = record["flops"] / record["ms"] / 1e9
    except Exception as exc:  # out of shared memory, compile failure
        record["error"] = str(exc)[:300]
    del record["flops"]
    print(json.dumps(record), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")
    return record


def make_problem(hdim, causal, seqlen, tokens=16384, device="cuda"):
    """Random bf16 q, k, v, dout of the paper's setup (hidden 2048), the options and the forward FLOPs."""
    batch, nheads = max(tokens // seqlen, 1), 2048 // hdim
    q, k, v, dout = (torch.randn(batch, seqlen, nheads, hdim, device=device, dtype=torch.bfloat16)
                     for _ in range(4))
    opts = AttnOptions(hdim**-0.5, window_right=0 if causal else -1)
    return q, k, v, dout, opts, 4 * batch * nheads * seqlen * seqlen * hdim / (2 if causal else 1)


def _sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)


def sweep_shape(hdim, causal, seqlen, out, budget, tokens=16384, device="cuda", modes=("fwd", "bwd"), extra=False,
                fwd_configs=None):
    q, k, v, dout, opts, fwd_flops = make_problem(hdim, causal, seqlen, tokens, device)
    ref = _sdpa(q, k, v, causal)
    base = {"hdim": hdim, "causal": causal, "seqlen": seqlen}

    if "fwd" in modes:
        if device == "cuda":  # the same run's cuDNN forward, the ratio's peer
            from torch.nn.attention import SDPBackend, sdpa_kernel

            # on its own (batch, heads, seqlen, dim) layout, as the package bench runs it
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                rec = {"kind": "fwd-cudnn", **base, "cfg": None, "flops": fwd_flops}
                _try(rec, lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                     lambda res: (res.transpose(1, 2).float() - ref.float()).abs().max().item(), out, budget)
        cur = fwd_config(hdim, causal, q.device, rows=seqlen)  # what the package runs at this length
        cands = fwd_configs or FWD[hdim] + (FWD_EXTRA[hdim] if extra else [])
        fwd_cands = [dataclasses.replace(cur, use_tma=False)] + [FwdConfig(*c) for c in cands]
        for cfg in dict.fromkeys(fwd_cands):
            rec = {"kind": "fwd", **base, "cfg": dataclasses.astuple(cfg), "flops": fwd_flops}
            _try(rec, lambda cfg=cfg: attention_forward(q, k, v, opts, config=cfg)[0],
                 lambda res: (res.float() - ref.float()).abs().max().item(), out, budget)
    if "bwd" not in modes:
        return

    out_, lse, _ = attention_forward(q, k, v, opts)
    cur = bwd_config(hdim, causal, q.device)
    exact = opts._replace(deterministic=True)
    ref_grads = [g.float() for g in attention_backward(dout, q, k, v, out_, lse, exact, config=cur)]
    dq_cur = (cur.dq_block_m, cur.dq_block_n, cur.dq_num_warps, cur.dq_num_stages)
    dkdv_cur = (cur.block_m, cur.block_n, cur.num_warps, cur.num_stages)
    bwd_cands = [dataclasses.replace(cur, use_tma=False, atomic_dq=False)]
    bwd_cands += [BwdConfig(*c, *dq_cur, False) for c in DKDV[hdim]]
    bwd_cands += [BwdConfig(*dkdv_cur, *c, False) for c in DQ[hdim]]
    bwd_cands += [BwdConfig(*c, *dq_cur, True) for c in DKDV[hdim]]
    for cfg in bwd_cands:
        rec = {"kind": "bwd", **base, "cfg": dataclasses.astuple(cfg), "flops": 2.5 * fwd_flops}
        _try(rec, lambda cfg=cfg: attention_backward(dout, q, k, v, out_, lse, opts, config=cfg),
             lambda res: max((g.float() - r).abs().max().item() for g, r in zip(res, ref_grads, strict=True)),
             out, budget)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, nargs="+", default=[4096])
    parser.add_argument("--hdims", type=int, nargs="+", default=[128, 64, 256])
    parser.add_argument("--out", default=None)
    parser.add_argument("--budget-s", type=float, default=500.0)
    # a dry run of the script's logic on the CPU (TRITON_INTERPRET=1): --device cpu --tokens 64
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--modes", nargs="+", choices=("fwd", "bwd"), default=["fwd", "bwd"])
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--extra", action="store_true", help="more forward candidates (FWD_EXTRA)")
    parser.add_argument("--fwd-configs", default=None,
                        help="the forward candidates instead of the lists, e.g. '64,64,4,3;64,64,4,3,1'")
    args = parser.parse_args()
    budget = Budget(args.budget_s)
    if args.out:
        with open(args.out, "w") as f:
            name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
            f.write(json.dumps({"device": name, "torch": torch.__version__,
                                "triton": triton.__version__, "seqlen": args.seqlen}) + "\n")
    t0 = time.time()
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    fwd_configs = None
    if args.fwd_configs:
        fwd_configs = [tuple(int(x) for x in c.split(",")) for c in args.fwd_configs.split(";")]
        fwd_configs = [c[:4] + tuple(bool(x) for x in c[4:]) for c in fwd_configs]
    for seqlen in args.seqlen:
        for hdim in args.hdims:
            for causal in causals:
                sweep_shape(hdim, causal, seqlen, args.out, budget, args.tokens, args.device, args.modes, args.extra,
                            fwd_configs)
    print(f"\nsweep took {time.time() - t0:.0f} s\n")


if __name__ == "__main__":
    main()
