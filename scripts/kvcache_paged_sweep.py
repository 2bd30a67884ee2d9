"""Paged (page size 16) decode sweep: split count x pipeline stages x keys per tile, kernels only (CUDA graph
replay), bf16 d128, 32 query heads. Run on a GPU: python scripts/kvcache_paged_sweep.py"""

import json
import sys
from pathlib import Path

import torch
import triton.testing

from flashattn2 import flash_attn_with_kvcache, inference
from flashattn2.kernels.portable import kvcache

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the decode benchmark's paged cache
from bench_decode import paged  # noqa: E402


def gbps(q, kp, vp, table, seqlen, splits, gb):
    def fn():
        return flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlen, block_table=table, num_splits=splits)

    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return round(gb / triton.testing.do_bench(graph.replay, warmup=20, rep=60, return_mode="median") * 1e3)


for nheads_k, batch, seqlen in ((8, 1, 131072), (32, 1, 131072), (8, 8, 131072), (8, 1, 32768)):
    q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, nheads_k, 128, device="cuda", dtype=torch.bfloat16)
    kp, table = paged(k, 16)
    vp = torch.randn_like(kp)
    gb = 2 * k.numel() * 2 / 1e9
    for block_n, stages in ((64, 3), (64, 4), (32, 4), (128, 2), (16, 6)):
        kvcache.kv_tiles = lambda block_d, paged, c=(block_n, stages): c  # noqa: E731
        kvcache._plans.clear()
        inference._seen.clear()
        row = {"nheads_k": nheads_k, "batch": batch, "seqlen": seqlen, "block_n": block_n, "stages": stages}
        for splits in (1, 4, 8, 16, 32, 64, 128):
            try:
                row[splits] = gbps(q, kp, vp, table, seqlen, splits, gb)
            except Exception as exc:  # a tile that does not fit is a result
                row[splits] = str(exc).splitlines()[0][:60]
        print(json.dumps(row), flush=True)
