"""Is a short forward call bound by its host time? For each case: the GPU time of flash_attn_func (do_bench, as the
benches) beside the host time of one call (back-to-back calls, no sync between them: how fast Python enqueues),
under the backend auto picks and forced ones.

    PYTHONPATH=src python scripts/host_vs_gpu.py [--out FILE.json] [--latent | --kept-ab]

16k tokens a batch, hidden 2048, non-causal (the benches' shapes). A call whose host time reaches its GPU time
leaves the GPU idle between calls in a tight loop (what ab_triton_fwd.py's package column measures). --latent:
instead, MLA latent decoding (flash_attn_with_kvcache, 576/512, 128 heads, one cached token in the new query's
place) at small batches, dense and paged, under Triton and Gluon. --kept-ab: host time of Gluon calls with the
launches' kept TMA descriptors (launch._Encoded) against Triton's launcher encoding them on every call, alternating
in one process.
"""

import argparse
import functools
import json
import time

import torch
import triton
from result_rows import write_rows

import flashattn2
from flashattn2 import flash_attn_func, quantize_fp8

CASES = [(128, 512, True), (128, 768, True), (64, 512, True), (256, 512, True), (128, 512, False)]
LATENT_CASES = [(1, 4096), (4, 4096), (8, 4096), (1, 16384)]  # (batch, cached keys)


def bench_inputs(head_dim: int, seqlen: int, fp8: bool) -> tuple:
    """(q, k, v, the descale keywords) of the benches' shape (16k tokens a batch, hidden 2048), in bf16 or
    quantised to e4m3 (quantize_fp8)."""
    q, k, v = (torch.randn(16384 // seqlen, seqlen, 2048 // head_dim, head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    if not fp8:
        return q, k, v, {}
    q, k, v, qd, kd, vd = quantize_fp8(q, k, v)
    return q, k, v, dict(q_descale=qd, k_descale=kd, v_descale=vd)


def host_us(fn, calls: int = 200, repeats: int = 5) -> float:
    """The least of `repeats` batches of `calls` (one batch read 25-85 µs for the same call in session 30)."""
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)  # enqueue time only: the GPU may still be busy
    torch.cuda.synchronize()
    return best / calls * 1e6


def latent_calls(batch: int, cache: int) -> dict:
    """flash_attn_with_kvcache over a full latent cache (576/512, 128 heads, the value cache a view), by layout."""
    from flashattn2 import flash_attn_with_kvcache

    kv = torch.randn(batch, cache, 1, 576, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((batch,), cache, device="cuda", dtype=torch.int32)
    pages = kv.view(-1, 64, 1, 576)
    table = torch.arange(pages.shape[0], device="cuda", dtype=torch.int32).view(batch, -1)
    return {layout: functools.partial(flash_attn_with_kvcache, q, k_cache, k_cache[..., :512], cache_seqlens=seqlens,
                                      block_table=block_table)
            for layout, k_cache, block_table in (("dense", kv, None), ("paged 64", pages, table))}


def latent_rows() -> list:
    rows = []
    for batch, cache in LATENT_CASES:
        for layout, fn in latent_calls(batch, cache).items():
            for backend in ("triton", "gluon"):
                flashattn2.set_backend(backend)
                row = dict(batch=batch, cache=cache, layout=layout, backend=backend, host_us=host_us(fn),
                           gpu_us=triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    flashattn2.set_backend("auto")
    return rows


def _kept_launches() -> list:
    import gc

    from flashattn2.kernels.launch import Launch

    return [o for o in gc.get_objects() if type(o) is Launch and o._encoded is not None]


def kept_ab_rows(rounds: int = 6) -> list:
    """Each case's host time, descriptors kept against encoded each call (the Launches' _encoded set aside), in
    alternating rounds within one process: the spread between processes was as large as the effect (session 32)."""
    flashattn2.set_backend("gluon")
    q, k, v, _ = bench_inputs(128, 512, False)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    dout = torch.randn_like(q)
    cases = {
        "latent batch 1, 4k, dense": latent_calls(1, 4096)["dense"],
        "latent batch 8, 4k, paged": latent_calls(8, 4096)["paged 64"],
        "forward bf16 d128 512": functools.partial(flash_attn_func, q, k, v),
        "forward+backward bf16 d128 512 causal": lambda: flash_attn_func(qg, kg, vg, causal=True).backward(dout),
    }
    rows = []
    for name, fn in cases.items():
        for _ in range(3):
            fn()
        launches = _kept_launches()
        kept = [o._encoded for o in launches]
        times = {"kept": [], "encoded each call": []}
        for r in range(rounds):
            for arm in (("kept", "encoded each call") if r % 2 == 0 else ("encoded each call", "kept")):
                for o, e in zip(launches, kept, strict=True):
                    o._encoded = e if arm == "kept" else None
                times[arm].append(host_us(fn, repeats=3))
        for o, e in zip(launches, kept, strict=True):
            o._encoded = e
        med = {arm: sorted(t)[len(t) // 2] for arm, t in times.items()}
        row = dict(case=name, launches=len(launches), **{f"{arm} us": t for arm, t in times.items()},
                   kept_median_us=med["kept"], encoded_median_us=med["encoded each call"])
        rows.append(row)
        print(f"{name:40s} {len(launches)} launches kept so far: median host {med['kept']:6.1f} µs kept, "
              f"{med['encoded each call']:6.1f} encoded each call", flush=True)
    flashattn2.set_backend("auto")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--latent", action="store_true", help="latent decoding's small calls instead")
    ap.add_argument("--kept-ab", action="store_true", help="kept descriptors against encoding each call instead")
    args = ap.parse_args()
    if args.latent or args.kept_ab:
        rows = latent_rows() if args.latent else kept_ab_rows()
        if args.out:
            write_rows(args.out, rows)
        return
    rows = []
    for head_dim, seqlen, fp8 in CASES:
        q, k, v, kw = bench_inputs(head_dim, seqlen, fp8)
        for backend in ("auto", "triton", "gluon"):
            flashattn2.set_backend(backend)
            chosen = flashattn2.attention_backend(q, k, v)[0]

            fn = functools.partial(flash_attn_func, q, k, v, **kw)
            row = dict(head_dim=head_dim, seqlen=seqlen, fp8=fp8, backend=backend, ran=chosen,
                       host_us=host_us(fn), gpu_us=triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    flashattn2.set_backend("auto")
    if args.out:
        write_rows(args.out, rows)


if __name__ == "__main__":
    main()
