"""Where the host time of a small call goes (b=1, seqlen 128, 1 head, head dim 64, bf16, causal).

    PYTHONPATH=src python scripts/profile_host.py            # per-layer wall times, no profiler
    PYTHONPATH=src python scripts/profile_host.py --cprofile # cProfile of forward+backward calls

Each row is the mean of back-to-back calls after a warm-up; the layers nest, so the differences
between rows say what each layer costs.
"""

import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import flashattn2
from flashattn2 import ops
from flashattn2.kernels.params import AttnOptions
from flashattn2.kernels.portable.backward import attention_backward
from flashattn2.kernels.portable.forward import attention_forward


class _Floor(torch.autograd.Function):
    """autograd with no work: what any Python-level attention pays for its graph node."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def mean_us(fn, iters=2000, sync=torch.cuda.synchronize) -> float:
    for _ in range(100):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cprofile", action="store_true")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--trace", metavar="DIR", help="torch.profiler of forward+backward calls: table, chrome trace")
    args = p.parse_args()
    device = "cuda"
    q, k, v = (torch.randn(1, 128, 1, 64, dtype=torch.bfloat16, device=device, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    leaves = (q, k, v)

    def with_bwd(fn, leaves=leaves, dout=dout):
        def step():
            for x in leaves:
                x.grad = None
            fn().backward(dout)
        return step

    qs, ks, vs = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in leaves)

    qd, kd, vd = (x.detach() for x in leaves)
    opts = AttnOptions(softmax_scale=0.125, window_right=0)
    saved = attention_forward(qd, kd, vd, opts)[:2]
    rows = {
        "torch.empty x2": lambda: (torch.empty(1, 128, 1, 64, dtype=torch.bfloat16, device=device),
                                   torch.empty(1, 1, 128, dtype=torch.float32, device=device)),
        "autograd floor fwd": lambda: _Floor.apply(q, k, v),
        "autograd floor fwd+bwd": with_bwd(lambda: _Floor.apply(q, k, v)),
        "attention_forward (kernel layer)": lambda: attention_forward(qd, kd, vd, opts),
        "ops.forward": lambda: ops.forward(qd, kd, vd, opts),
        "attention_backward (kernel layer)": lambda: attention_backward(dout, qd, kd, vd, *saved, opts),
        "flash_attn_func, no grad": lambda: flashattn2.flash_attn_func(qd, kd, vd, causal=True),
        "flash_attn_func fwd": lambda: flashattn2.flash_attn_func(q, k, v, causal=True),
        "flash_attn_func fwd+bwd": with_bwd(lambda: flashattn2.flash_attn_func(q, k, v, causal=True)),
        "sdpa-flash fwd": lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True),
        "sdpa-flash fwd+bwd": with_bwd(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True),
                                       (qs, ks, vs), dout.transpose(1, 2).contiguous()),
    }
    if args.trace:
        from torch.profiler import ProfilerActivity, profile

        for name in ("flash_attn_func fwd+bwd", "sdpa-flash fwd+bwd"):
            step = rows[name]
            for _ in range(20):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(30):
                    step()
                torch.cuda.synchronize()
            print(name)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
            prof.export_chrome_trace(f"{args.trace}/{name.split()[0]}_trace.json")
        return
    if args.cprofile:
        step = rows["flash_attn_func fwd+bwd"]
        for _ in range(20):
            step()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            step()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for name, fn in rows.items():
            print(f"{name:36s} {mean_us(fn):8.1f} us", flush=True)


if __name__ == "__main__":
    main()
