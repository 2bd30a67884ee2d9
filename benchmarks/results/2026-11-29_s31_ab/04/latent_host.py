"""Latent-cache decoding (576/512, 128 heads): host time of one call (enqueue only) against its GPU time (do_bench)
and its CUDA-graph replay time (GPU alone, no host), by backend; then a cProfile of the slowest host path."""
import cProfile
import functools
import io
import json
import pstats
import sys
import time

import torch
import triton

sys.path.insert(0, "benchmarks")
import flashattn2  # noqa: E402
from bench_decode import paged  # noqa: E402
from flashattn2 import flash_attn_with_kvcache  # noqa: E402


def host_us(fn, calls=200, repeats=5):
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t)
    torch.cuda.synchronize()
    return best / calls * 1e6


def graph_us(fn, n=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return triton.testing.do_bench(g.replay, warmup=5, rep=100) * 1e3 / n


rows = []
profiled = None
for batch in (1, 8, 64):
    for cache in (4096, 16384):
        kv = torch.randn(batch, cache, 1, 576, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(batch, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.full((batch,), cache, device="cuda", dtype=torch.int32)
        for layout in ("dense", "paged"):
            k_cache, table = (kv, None) if layout == "dense" else paged(kv, 64)
            v_cache = k_cache[..., :512]
            for backend in ("auto", "gluon", "triton"):
                flashattn2.set_backend(backend)
                fn = functools.partial(flash_attn_with_kvcache, q, k_cache, v_cache, cache_seqlens=seqlens,
                                       block_table=table)
                try:
                    row = dict(batch=batch, cache=cache, layout=layout, backend=backend, host_us=host_us(fn),
                               gpu_us=triton.testing.do_bench(fn, warmup=10, rep=60) * 1e3, graph_us=graph_us(fn))
                except Exception as exc:  # noqa: BLE001
                    row = dict(batch=batch, cache=cache, layout=layout, backend=backend, error=repr(exc)[:200])
                rows.append(row)
                print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
                if (batch, cache, layout, backend) == (8, 4096, "dense", "gluon"):
                    profiled = fn
flashattn2.set_backend("gluon")
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    profiled()
pr.disable()
torch.cuda.synchronize()
out = io.StringIO()
pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(30)
print(out.getvalue()[:9000])
out = io.StringIO()
pstats.Stats(pr, stream=out).sort_stats("cumulative").print_stats(35)
print(out.getvalue()[:9000])
flashattn2.set_backend("auto")
import os  # noqa: E402

with open(os.path.join(os.environ.get("OUT", "."), "latent_host.json"), "w") as f:
    json.dump(rows, f, indent=1)
