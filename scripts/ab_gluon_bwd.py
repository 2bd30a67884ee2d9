"""A/B of Gluon dK/dV tunings (kernels/bwd_sm90.py CONFIGS) inside the whole backward (preprocess, dK/dV,
dQ kernel) against the all-Triton backward and cuDNN, interleaved per shape:
python scripts/ab_gluon_bwd.py --out DIR. Each variant's gradients are checked against Triton's first."""

import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn2
from flashattn2.kernels import backward, bwd_sm90, forward
from flashattn2.kernels.params import AttnOptions

VARIANTS = {"m32-s3": dict(BLOCK_M=32, STAGES=3), "m32-s4": dict(BLOCK_M=32, STAGES=4),
            "m64-s2": dict(BLOCK_M=64, STAGES=2), "m64-s3": dict(BLOCK_M=64, STAGES=3)}


def measure(hdim: int, causal: bool, seqlen: int) -> dict:
    batch, nheads = 16384 // seqlen, 2048 // hdim
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    opts = AttnOptions(softmax_scale=hdim ** -0.5, window_left=-1, window_right=0 if causal else -1)
    out, lse, _ = forward.attention_forward(q, k, v, opts)
    flops = 2.5 * 4 * batch * nheads * seqlen * seqlen * hdim / (2 if causal else 1)
    row = dict(hdim=hdim, causal=causal, seqlen=seqlen, errors={})
    flashattn2.set_backend("triton")
    ref = backward.backward_plan(dout, q, k, v, out, lse, opts)
    ref_grads = ref(dout, q, k, v, out, lse, opts)
    fns = {"triton": lambda: ref(dout, q, k, v, out, lse, opts)}
    flashattn2.set_backend("gluon")
    for name, tuning in VARIANTS.items():
        bwd_sm90.CONFIGS[hdim] = tuning
        backward._plans.clear()
        plan = backward.backward_plan(dout, q, k, v, out, lse, opts)
        assert plan.gluon_dkdv is not None
        grads = plan(dout, q, k, v, out, lse, opts)
        errs = [(g.float() - r.float()).abs().max().item() for g, r in zip(grads, ref_grads, strict=True)]
        row["errors"][name] = errs
        if not all(e < 5e-2 for e in errs):  # NaN fails too
            print(f"WRONG {name} d{hdim} causal={causal} s{seqlen}: {errs}", flush=True)
            continue
        fns["gluon-" + name] = (lambda p: lambda: p(dout, q, k, v, out, lse, opts))(plan)
    flashattn2.set_backend("auto")
    qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dot = dout.transpose(1, 2).contiguous()
        fns["cudnn"] = lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)
        for name, fn in fns.items():
            row[name] = round(flops / triton.testing.do_bench(fn, warmup=25, rep=100) / 1e9, 1)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    for causal in (False, True):
        for seqlen in (1024, 4096, 16384):
            rows.append(measure(128, causal, seqlen))
            print(json.dumps(rows[-1]), flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d"))
    with open(f"{args.out}/ab_gluon_bwd.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
