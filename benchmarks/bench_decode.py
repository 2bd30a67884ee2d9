"""python benchmarks/bench_decode.py: decoding (seqlen_q = 1) at the memory-bandwidth limit.

bf16, head dim 128, 32 query heads over 8 KV heads (GQA) and over 32 (MHA). Effective bandwidth = bytes of
K and V read / time, against the GPU's copy bandwidth measured in the same run (a device-to-device copy:
bytes read + written / time). Peers on the same keys: SDPA (each backend that takes the shape) on a dense
cache, FlexAttention if it compiles, and our flash_attn_func. Also: split-KV on and off at batch 1, page
size 16, a CUDA-graph-captured decode loop, and the host time of one decode step. "ours-graph" is our call
replayed from a CUDA graph: its kernels' time without the host's (every other column is an eager call).
Writes <out-dir>/<stem>_decode.json (its markdown and PNG: python benchmarks/report_decode.py <json>).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench_overhead import per_call_us
from flashattn2.bench import collect_meta, default_stem, time_call

HDIM, NHEADS = 128, 32
SDPA = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-mem-eff": SDPBackend.EFFICIENT_ATTENTION}


def copy_bandwidth(gib: float = 2.0) -> float:
    """GB/s of a device-to-device copy (bytes read + bytes written)."""
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = time_call(lambda: dst.copy_(src), "cuda", trials=3)
    return 2 * src.numel() * 2 / ms / 1e6


def _kv_bytes(batch, seqlen, nheads_k):
    return 2 * batch * seqlen * nheads_k * HDIM * 2


def paged(k_cache: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k_cache (batch, seqlen, ...) as a pool of pages in shuffled order and its block table."""
    batch, seqlen = k_cache.shape[:2]
    per_seq = seqlen // page
    table = torch.randperm(batch * per_seq, device="cuda").view(batch, per_seq).to(torch.int32)
    pool = torch.empty(batch * per_seq, page, *k_cache.shape[2:], dtype=k_cache.dtype, device="cuda")
    pool[table.long()] = k_cache.view(batch, per_seq, page, *k_cache.shape[2:])
    return pool, table


def _flex(q, k, v):
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda: compiled(q, k, v, enable_gqa=k.shape[1] != q.shape[1])


def _graphed(fn):
    """fn captured in a CUDA graph: the replay costs the kernels' time, not the host's."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def measure(batch: int, seqlen: int, nheads_k: int, peers: bool, flex: bool) -> dict:
    from flashattn2 import flash_attn_func, flash_attn_with_kvcache

    q = torch.randn(batch, 1, NHEADS, HDIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, nheads_k, HDIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    gb = _kv_bytes(batch, seqlen, nheads_k) / 1e9
    row = {"batch": batch, "seqlen": seqlen, "nheads_k": nheads_k, "kv_gb": gb}
    calls = {"ours": lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlen)}
    if batch == 1 or seqlen >= 32768:
        calls["ours-nosplit"] = lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlen, num_splits=1)
    if seqlen % 16 == 0:
        kp, table = paged(k, 16)
        vp = torch.empty_like(kp)
        vp[table.long()] = v.view(batch, seqlen // 16, 16, nheads_k, HDIM)
        calls["ours-page16"] = lambda: flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlen, block_table=table)
    if peers:
        calls["ours-flash_attn_func"] = lambda: flash_attn_func(q, k, v)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        for name, backend in SDPA.items():
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=nheads_k != NHEADS)
            calls[name] = sdpa
        if flex:
            calls["flex"] = _flex(qt, kt.contiguous(), vt.contiguous())
    calls["ours-graph"] = _graphed(calls["ours"])
    for name, fn in calls.items():
        try:
            fn()
            ms = time_call(fn, "cuda", trials=3)
            row[f"{name}_us"] = ms * 1e3
            row[f"{name}_gbps"] = gb / ms * 1e3
        except Exception as exc:  # a peer that refuses the shape is a result, not a failure
            row[f"{name}_error"] = str(exc).splitlines()[0][:160]
    print(json.dumps(row), flush=True)
    return row


def graph_loop(batch: int = 8, seqlen: int = 8192, nheads_k: int = 8, steps: int = 64) -> dict:
    """Per-step time of a decode loop (append one token, attend) run eagerly and replayed from a CUDA graph."""
    from flashattn2 import flash_attn_with_kvcache

    k = torch.randn(batch, seqlen + steps, nheads_k, HDIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(batch, 1, NHEADS, HDIM, device="cuda", dtype=torch.bfloat16)
    kn = torch.randn(batch, 1, nheads_k, HDIM, device="cuda", dtype=torch.bfloat16)
    vn = torch.randn_like(kn)
    lens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")

    def step():
        flash_attn_with_kvcache(q, k, v, kn, vn, cache_seqlens=lens, causal=True)
        lens.add_(1)

    step()
    lens.fill_(seqlen)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - t0) / steps * 1e6
    lens.fill_(seqlen)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    lens.fill_(seqlen)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        graph.replay()
    torch.cuda.synchronize()
    graph_us = (time.perf_counter() - t0) / steps * 1e6
    row = {"batch": batch, "seqlen": seqlen, "nheads_k": nheads_k, "steps": steps, "eager_us_per_step": eager_us,
           "graph_us_per_step": graph_us}
    print(json.dumps(row), flush=True)
    return row


def host_time() -> dict:
    """Wall time per call of back-to-back small decode steps (host-bound), next to the training path."""
    from flashattn2 import flash_attn_func, flash_attn_with_kvcache

    q = torch.randn(1, 1, NHEADS, HDIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1024, 8, HDIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kn = torch.randn(1, 1, 8, HDIM, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((1,), 512, dtype=torch.int32, device="cuda")
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    steps = {
        "with_kvcache (append + attend)": (None, lambda: flash_attn_with_kvcache(q, k, v, kn, kn, cache_seqlens=lens)),
        "with_kvcache (attend)": (None, lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)),
        "flash_attn_func": (None, lambda: flash_attn_func(q, k, v)),
        "sdpa (default backend)": (None, lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)),
    }
    result = per_call_us(steps, iters=300, repeats=5)
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_decode.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--tag", default=None)
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--seqlens", default="1024,8192,32768,131072")
    parser.add_argument("--no-flex", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: the decode benchmark needs one", file=sys.stderr)
        return 2
    start = time.time()
    copy = copy_bandwidth()
    print(f"copy bandwidth {copy:.0f} GB/s", flush=True)
    free = torch.cuda.mem_get_info()[0]
    rows = []
    for nheads_k in (8, 32):
        for batch in map(int, args.batches.split(",")):
            for seqlen in map(int, args.seqlens.split(",")):
                # the cache, a paged copy and the peers' views must fit
                if 3 * _kv_bytes(batch, seqlen, nheads_k) > 0.6 * free:
                    continue
                peers = seqlen <= 32768
                flex = peers and not args.no_flex and batch == 8 and seqlen == 8192
                rows.append(measure(batch, seqlen, nheads_k, peers, flex))
                torch.cuda.empty_cache()
    result = {"meta": collect_meta(torch.cuda.get_device_name(), argv, prog="python benchmarks/bench_decode.py"),
              "copy_gbps": copy, "rows": rows, "graph": graph_loop(), "host": host_time()}
    result["meta"]["elapsed_s"] = round(time.time() - start, 1)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = (args.tag or default_stem(torch.cuda.get_device_name())) + "_decode"
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out_dir / stem}.json (markdown and PNG: python benchmarks/report_decode.py {out_dir / stem}.json)",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
