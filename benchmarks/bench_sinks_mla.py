"""python benchmarks/bench_sinks_mla.py: what a learnable sink costs, and the unlike-head-dim (MLA) speed (issue 27).

Each row times one call next to its baseline in the same run (median ms, forward and backward alone):
  sink    flash_attn_func with learnable_sink vs the same call without (target: at most 3% more, each way);
          gpt-oss's shapes (64 query heads, 8 key heads, head dim 64; causal, and the 128-key sliding window)
          and head dim 128; decoding through flash_attn_with_kvcache with and without the sink
  mla     query/key head dim 192, value head dim 128, causal, 16 heads, 16k tokens per batch: ours against
          SDPA's cuDNN backend on the same tensors (target: at least 1.0x), and ours at 128/128 for scale
  latent  MLA decoding over one latent cache (query/key 576, value 512 as a view of the key cache's first
          channels, 1 KV head, 128 query heads, one new token), batch 1-64, 4k-64k cache, dense and paged (page
          64): the cache's bytes read once / time against the copy bandwidth of the same run (target: 80%),
          and against the bound that the same run's bf16 matmul rate sets (128 heads: 242 FLOP a cache byte);
          each eager row also replayed from a CUDA graph (the kernels' time without the host's, as a serving
          loop runs decode: an eager call's host time reaches 50-110 µs, above the GPU time of the small rows)
Writes <out-dir>/<stem>_sinks_mla.json and .md.
"""

import argparse
import functools
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).parent))
from bench_features import save, time_fwd_bwd  # noqa: E402

TOKENS = 16384
ROUNDS = 3  # each sink row and its baseline, timed in turn


def _rand(*shape, grad=True):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=grad)


def _row(rows, group, variant, fwd, bwd, base=None, tflop=None):
    row = {"group": group, "variant": variant, "fwd_ms": fwd, "bwd_ms": bwd}
    if base is not None:
        row["fwd_ratio"], row["bwd_ratio"] = fwd / base["fwd_ms"], (bwd / base["bwd_ms"] if bwd else None)
    if tflop is not None:
        row["fwd_tflops"], row["bwd_tflops"] = tflop / fwd / 1e9, (2.5 * tflop / bwd / 1e9 if bwd else None)
    rows.append(row)
    extra = "" if base is None else f"  x{row['fwd_ratio']:.3f} / x{row['bwd_ratio'] or 0:.3f} of the baseline"
    print(f"{group:5s} {variant:58s} fwd {fwd:8.3f} ms  bwd {bwd or 0:8.3f} ms{extra}", flush=True)
    return row


def _time_fwd(fn, warmup=20, rep=80):
    import triton.testing

    with torch.no_grad():
        fn()
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def _interleaved(calls, rounds=ROUNDS):
    """Median (fwd, bwd) ms of each (fn, leaves), timed in turn `rounds` times: a clock that drifts during the run
    moves both sides of a ratio alike."""
    times = [[time_fwd_bwd(fn, leaves) for fn, leaves in calls] for _ in range(rounds)]
    return [tuple(statistics.median(t[i][j] for t in times) for j in range(2)) for i in range(len(calls))]


def sinks(rows, rounds=ROUNDS):
    from flashattn2 import flash_attn_func, flash_attn_with_kvcache

    for name, heads, heads_k, hdim, seqlen, window in (
            ("gpt-oss causal", 64, 8, 64, 4096, (-1, -1)),
            ("gpt-oss window 128", 64, 8, 64, 4096, (128, 0)),
            ("gpt-oss causal", 64, 8, 64, 16384, (-1, -1)),
            ("d128 causal", 16, 16, 128, 4096, (-1, -1)),
            ("d128 causal", 16, 16, 128, 16384, (-1, -1))):
        batch = max(1, TOKENS // seqlen)
        q = _rand(batch, seqlen, heads, hdim)
        k, v = (_rand(batch, seqlen, heads_k, hdim) for _ in range(2))
        sink = torch.randn(heads, device="cuda", dtype=torch.float32, requires_grad=True)
        label = f"{name}, {batch} x {seqlen}, {heads}/{heads_k} heads, d{hdim}"
        call = functools.partial(flash_attn_func, q, k, v, causal=True, window_size=window)
        plain, with_sink = _interleaved([(call, [q, k, v]), (functools.partial(call, learnable_sink=sink),
                                                             [q, k, v, sink])], rounds)
        base = _row(rows, "sink", f"{label}: no sink", *plain)
        _row(rows, "sink", f"{label}: learnable_sink", *with_sink, base=base)
        del q, k, v, call
    # decoding: one new token per sequence over a 8k cache
    batch, cache, heads, heads_k, hdim = 32, 8192, 64, 8, 64
    k_cache, v_cache = (_rand(batch, cache, heads_k, hdim, grad=False) for _ in range(2))
    q = _rand(batch, 1, heads, hdim, grad=False)
    seqlens = torch.full((batch,), cache, device="cuda", dtype=torch.int32)
    sink = torch.randn(heads, device="cuda", dtype=torch.float32)
    label = f"decode, {batch} x 1 over {cache} keys, {heads}/{heads_k} heads, d{hdim}"
    base = _row(rows, "sink", f"{label}: no sink",
                _time_fwd(lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)), None)
    _row(rows, "sink", f"{label}: learnable_sink", _time_fwd(lambda: flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, learnable_sink=sink)), None, base=base)


def _mla_items(items: str) -> None:
    """The Gluon MLA backward's items: "128-key" (CONFIGS_MLA, the default), "64-key" (CONFIGS_MLA_NARROW) or
    "128-key-scheduled" (CONFIGS_MLA with PERSISTENT_CAUSAL: causal calls on the scheduled persistent grid),
    "128-key-one-slot" (CONFIGS_MLA without DQ_SPARE_SLOT)."""
    import flashattn2
    from flashattn2.kernels.sm90 import backward as bwd_sm90

    saved = _MLA_DEFAULTS.setdefault("configs", bwd_sm90.CONFIGS_MLA)
    scheduled = {dims: dict(config, PERSISTENT_CAUSAL=True) for dims, config in saved.items()}
    one_slot = {dims: dict(config, DQ_SPARE_SLOT=False) for dims, config in saved.items()}
    bwd_sm90.CONFIGS_MLA = {"64-key": bwd_sm90.CONFIGS_MLA_NARROW, "128-key-scheduled": scheduled,
                            "128-key-one-slot": one_slot}.get(items, saved)
    flashattn2.set_backend(flashattn2.get_backend())  # drops the plans made with the other tuning


_MLA_DEFAULTS: dict = {}


def mla(rows, items=("128-key",)):
    from flashattn2 import flash_attn_func

    heads = 16
    for seqlen in (2048, 4096, 8192, 16384):
        batch = TOKENS // seqlen
        # causal attention FLOPs: half of 2 * (d_qk + d_v) per pair
        flop = batch * heads * seqlen * seqlen * (192 + 128)
        q, k = (_rand(batch, seqlen, heads, 192) for _ in range(2))
        v = _rand(batch, seqlen, heads, 128)
        qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))

        def cudnn(qt=qt, kt=kt, vt=vt):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        label = f"192/128 causal, {batch} x {seqlen}, {heads} heads"
        try:
            base = _row(rows, "mla", f"{label}: SDPA cuDNN", *time_fwd_bwd(cudnn, [qt, kt, vt]), tflop=flop)
        except RuntimeError as exc:  # cuDNN may refuse a shape: say so and go on
            print(f"mla   {label}: SDPA cuDNN refused: {str(exc).splitlines()[0]}", flush=True)
            base = None
        for item in items:
            _mla_items(item)
            tag = "" if items == ("128-key",) else f" ({item} items)"
            _row(rows, "mla", f"{label}: ours{tag}", *time_fwd_bwd(
                functools.partial(flash_attn_func, q, k, v, causal=True), [q, k, v]), base=base, tflop=flop)
        _mla_items("128-key")
        q2, k2, v2 = (_rand(batch, seqlen, heads, 128) for _ in range(3))
        _row(rows, "mla", f"128/128 causal, {batch} x {seqlen}, {heads} heads: ours", *time_fwd_bwd(
            functools.partial(flash_attn_func, q2, k2, v2, causal=True), [q2, k2, v2]),
            tflop=batch * heads * seqlen * seqlen * 256)
        del q, k, v, qt, kt, vt, q2, k2, v2


def latent(rows, backends=("auto",), batches=(1, 8, 64), caches=(4096, 16384, 65536), heads=128,
           layouts=("dense", "paged 64"), splits=(0,)):
    from bench_decode import _graphed, copy_bandwidth, paged
    from bench_fp8 import matmul_rates
    from flashattn2 import flash_attn_with_kvcache

    copy = copy_bandwidth()
    matmul = matmul_rates()["bf16_tflops"]
    # FLOP per cache byte: with 128 heads (242) past H200's matmul/copy ratio, the call is bound by the tensor cores
    intensity = heads * (576 + 512) * 2 / (576 * 2)
    bound = min(copy, matmul * 1e3 / intensity)
    print(f"latent copy bandwidth {copy:.0f} GB/s, bf16 matmul {matmul:.0f} TFLOP/s: bound {bound:.0f} GB/s",
          flush=True)
    rows.append({"group": "latent", "variant": "device-to-device copy", "fwd_ms": None, "bwd_ms": None,
                 "gbps": copy})
    rows.append({"group": "latent", "variant": f"bf16 matmul 8192^3 ({matmul:.0f} TFLOP/s) / {intensity:.0f} FLOP "
                 "a cache byte", "fwd_ms": None, "bwd_ms": None, "gbps": matmul * 1e3 / intensity,
                 "fwd_tflops": matmul})
    for batch in batches:
        for cache in caches:
            kv = _rand(batch, cache, 1, 576, grad=False)
            q = _rand(batch, 1, heads, 576, grad=False)
            seqlens = torch.full((batch,), cache, device="cuda", dtype=torch.int32)
            for layout in layouts:
                if layout == "dense":
                    k_cache, table = kv, None
                else:
                    k_cache, table = paged(kv, 64)
                v_cache = k_cache[..., :512]  # the value cache is a view: the cache is read once
                # each backend (and split count: 0 is the package's choice) of the same shape in turn: the same clocks
                for backend, num_splits in itertools.product(backends, splits):
                    _latent_backend(backend)
                    call = functools.partial(flash_attn_with_kvcache, q, k_cache, v_cache, cache_seqlens=seqlens,
                                             block_table=table, num_splits=num_splits)
                    ms = _time_fwd(call)
                    graph_ms = _time_fwd(_graphed(call))
                    gbps = batch * cache * 576 * 2 / ms / 1e6
                    graph_gbps = batch * cache * 576 * 2 / graph_ms / 1e6
                    tflops = batch * heads * cache * (576 + 512) * 2 / ms / 1e9
                    tag = ("" if backends == ("auto",) else f", {backend}") + \
                        ("" if splits == (0,) else f", splits {num_splits or 'auto'}")
                    row = {"group": "latent", "variant": f"576/512, {heads} heads, batch {batch}, cache {cache}, "
                           f"{layout}{tag}", "fwd_ms": ms, "bwd_ms": None, "gbps": gbps, "of_copy": gbps / copy,
                           "of_bound": gbps / bound, "fwd_tflops": tflops, "graph_ms": graph_ms,
                           "graph_of_copy": graph_gbps / copy, "graph_of_bound": graph_gbps / bound}
                    rows.append(row)
                    print(f"latent {row['variant']:58s} {ms:8.3f} ms  {gbps:7.0f} GB/s  {gbps / copy:.2f} of copy  "
                          f"{tflops:5.0f} TFLOP/s  {gbps / bound:.2f} of bound; graph {graph_ms:.3f} ms  "
                          f"{graph_gbps / copy:.2f} of copy  {graph_gbps / bound:.2f} of bound", flush=True)
            _latent_backend("auto")


def _latent_backend(spec: str) -> None:
    """'auto', 'triton', 'gluon' or 'gluon:VALUE_WGS=2' (the Gluon latent kernel's tuning over its defaults,
    sm90/latent.py; several keys joined with +)."""
    import flashattn2
    from flashattn2 import inference
    from flashattn2.kernels.portable import kvcache
    from flashattn2.kernels.sm90 import latent

    defaults = _LATENT_DEFAULTS.setdefault("tuning", dict(latent.LATENT_TUNING))
    name, _, tuning = spec.partition(":")
    flashattn2.set_backend(name)
    wanted = dict(defaults, **{k: int(v) for k, v in (t.split("=") for t in tuning.split("+") if t)})
    if wanted != latent.LATENT_TUNING:
        latent.LATENT_TUNING = wanted
        inference._seen.clear()  # plans made under the other tuning
        kvcache._plans.clear()


_LATENT_DEFAULTS: dict = {}


def write(rows, meta, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}_sinks_mla.json", out_dir / f"{stem}_sinks_mla.md"]
    paths[0].write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# flashattn2: sink cost and unlike head dims (MLA)", ""] + [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "bf16; median ms of forward and of backward alone; ratio: against the row's baseline (the call "
              "without a sink; SDPA cuDNN for MLA).", "",
              "| group | variant | fwd ms | bwd ms | fwd ratio | bwd ratio | fwd TFLOP/s | bwd TFLOP/s |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]

    def f(x, fmt):
        return "" if x is None else format(x, fmt)

    bw = [r for r in rows if r["group"] == "latent"]
    rows = [r for r in rows if r["group"] != "latent"]
    lines += [f"| {r['group']} | {r['variant']} | {r['fwd_ms']:.3f} | {f(r['bwd_ms'], '.3f')} | "
              f"{f(r.get('fwd_ratio'), '.3f')} | {f(r.get('bwd_ratio'), '.3f')} | {f(r.get('fwd_tflops'), '.0f')} | "
              f"{f(r.get('bwd_tflops'), '.0f')} |" for r in rows]
    if bw:
        lines += ["", "Latent-cache decoding: the cache's bytes (batch x cache x 576 x 2) / time, against the copy "
                  "bandwidth (bytes read + written / time) of the same run, and against the bound: the lower of "
                  "the copy bandwidth and the same run's bf16 matmul rate over the call's FLOP per cache byte. "
                  "graph: the same call replayed from a CUDA graph (the kernels' time without the host's).", "",
                  "| variant | ms | GB/s | of copy | TFLOP/s | of bound | graph ms | graph of copy | graph of bound |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['variant']} | {f(r['fwd_ms'], '.3f')} | {r['gbps']:.0f} | {f(r.get('of_copy'), '.2f')} | "
                  f"{f(r.get('fwd_tflops'), '.0f')} | {f(r.get('of_bound'), '.2f')} | {f(r.get('graph_ms'), '.3f')} | "
                  f"{f(r.get('graph_of_copy'), '.2f')} | {f(r.get('graph_of_bound'), '.2f')} |" for r in bw]
    paths[1].write_text("\n".join(lines) + "\n")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_sinks_mla.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--tag", default=None)
    parser.add_argument("--only", choices=("sink", "mla", "latent"), default=None)
    parser.add_argument("--sink-rounds", type=int, default=ROUNDS,
                        help="each sink row and its baseline timed in turn this many times (median); one run's "
                        "16k rows moved 7%% between runs at 3 (2026-11-28)")
    parser.add_argument("--mla-items", default="128-key",
                        help="the Gluon MLA backward's items, comma-separated, each timed on each mla row: 128-key "
                        "(the default tuning, CONFIGS_MLA), 64-key (CONFIGS_MLA_NARROW), 128-key-scheduled "
                        "(CONFIGS_MLA on the scheduled persistent causal grid), 128-key-one-slot "
                        "(without DQ_SPARE_SLOT)")
    parser.add_argument("--latent-backends", default="auto",
                        help="backends timed in turn on each latent row, comma-separated: auto, triton, gluon, or "
                        "gluon:VALUE_WGS=2 (a Gluon latent tuning over its defaults; several keys joined with +)")
    parser.add_argument("--latent-batches", default="1,8,64", help="the latent rows' batch sizes, comma-separated")
    parser.add_argument("--latent-layouts", default="dense,paged 64",
                        help="the latent rows' cache layouts, comma-separated: dense, paged 64")
    parser.add_argument("--latent-splits", default="0",
                        help="num_splits values timed in turn on each latent row, comma-separated (0: the package's "
                        "choice, one wave of programs)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: this benchmark needs one", file=sys.stderr)
        return 2
    start, rows = time.time(), []
    if args.only in (None, "sink"):
        sinks(rows, args.sink_rounds)
    if args.only in (None, "mla"):
        mla(rows, tuple(args.mla_items.split(",")))
    if args.only in (None, "latent"):
        latent(rows, tuple(args.latent_backends.split(",")),
               batches=tuple(int(b) for b in args.latent_batches.split(",")),
               layouts=tuple(args.latent_layouts.split(",")),
               splits=tuple(int(n) for n in args.latent_splits.split(",")))
    save(rows, write, argv, "python benchmarks/bench_sinks_mla.py", start, args.out_dir, args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
