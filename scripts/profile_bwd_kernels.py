"""Which GPU kernels a backward call launches, and how long each takes (torch.profiler, CUDA time).

    PYTHONPATH=src python scripts/profile_bwd_kernels.py [--shapes mla:8x2048 mla:1x16384 d128:4x4096] [--peer]

bf16, causal, 16 heads (MLA: 192/128; dN: head dim N). Each shape: the forward once, then `--reps` backward calls
through autograd (retain_graph) under the profiler; the table is the mean CUDA time a call by kernel name, so the
kernels around the main one (preprocess, dQ conversion, copies, allocations' fills) show beside it. With --peer,
cuDNN's backward through SDPA the same way.
"""

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile


def _inputs(kind: str, batch: int, seqlen: int, heads: int = 16):
    dqk, dv = (192, 128) if kind == "mla" else (int(kind[1:]),) * 2
    q, k = (torch.randn(batch, seqlen, heads, dqk, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(batch, seqlen, heads, dv, device="cuda", dtype=torch.bfloat16)
    do = torch.randn(batch, seqlen, heads, dv, device="cuda", dtype=torch.bfloat16)
    return q, k, v, do


def _table(fn, reps: int) -> list[tuple[str, float, int]]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += e.device_time
            count[e.name] += 1
    return sorted(((n, t / reps, count[n] // reps) for n, t in total.items()), key=lambda r: -r[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["mla:8x2048", "mla:1x16384", "d128:4x4096"])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--peer", action="store_true", help="cuDNN's backward through SDPA too")
    args = parser.parse_args()
    from flashattn2 import flash_attn_func

    for spec in args.shapes:
        kind, dims = spec.split(":")
        batch, seqlen = (int(x) for x in dims.split("x"))
        q, k, v, do = _inputs(kind, batch, seqlen)
        runs = {}
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        out = flash_attn_func(qg, kg, vg, causal=True)
        runs["ours"] = lambda out=out, qg=qg, kg=kg, vg=vg, do=do: torch.autograd.grad(out, (qg, kg, vg), do,
                                                                                      retain_graph=True)
        if args.peer:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                oc = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
            dot = do.transpose(1, 2).contiguous()
            runs["cudnn"] = lambda oc=oc, qt=qt, kt=kt, vt=vt, dot=dot: torch.autograd.grad(
                oc, (qt, kt, vt), dot, retain_graph=True)
        for name, fn in runs.items():
            rows = _table(fn, args.reps)
            print(f"\n{spec} {name}: {sum(r[1] for r in rows) / 1e3:.3f} ms of kernels a call")
            for kernel, us, n in rows:
                print(f"  {us / 1e3:8.3f} ms  x{n}  {kernel[:110]}")


if __name__ == "__main__":
    main()
