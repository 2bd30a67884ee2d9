"""Split-KV sweep behind kvcache.num_splits_heuristic: decode time per num_splits at a few batch sizes and
cache lengths (bf16, d128, 32 query heads). Run on a GPU: python scripts/kvcache_splits.py"""

import json

import torch
import triton.testing

from flashattn2 import flash_attn_with_kvcache

for nheads_k, batch, seqlen in ((8, 1, 131072), (8, 1, 32768), (32, 1, 131072), (8, 4, 32768), (32, 1, 8192),
                                (8, 8, 8192), (8, 1, 8192)):
    q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, nheads_k, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    gb = 2 * k.numel() * 2 / 1e9
    row = {"nheads_k": nheads_k, "batch": batch, "seqlen": seqlen}
    for splits in (0, 1, 4, 8, 16, 24, 32, 48, 64, 96, 128):
        fn = lambda s=splits, q=q, k=k, v=v, n=seqlen: flash_attn_with_kvcache(q, k, v, cache_seqlens=n, num_splits=s)  # noqa: E731,E501
        fn()
        graph = torch.cuda.CUDAGraph()  # the kernels alone, without the host's time
        with torch.cuda.graph(graph):
            fn()
        ms = triton.testing.do_bench(graph.replay, warmup=20, rep=60, return_mode="median")
        row[splits] = round(gb / ms * 1e3)
    print(json.dumps(row), flush=True)
