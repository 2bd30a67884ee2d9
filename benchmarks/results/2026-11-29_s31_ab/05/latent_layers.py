"""Where a latent decoding call's host time goes: each layer wrapped with a perf_counter accumulator (mean µs per
call over back-to-back calls, no sync between), for batch 8 (splits + combine) and batch 64 (one split) at 4k."""
import collections
import functools
import json
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
import flashattn2  # noqa: E402
from flashattn2 import flash_attn_with_kvcache, inference  # noqa: E402
from flashattn2.kernels import common, launch  # noqa: E402
from flashattn2.kernels.portable import kvcache  # noqa: E402
from flashattn2.kernels.sm90 import latent  # noqa: E402

acc = collections.defaultdict(float)
cnt = collections.defaultdict(int)


def wrap(owner, name, label):
    orig = getattr(owner, name)

    @functools.wraps(orig)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            acc[label] += time.perf_counter() - t
            cnt[label] += 1
    setattr(owner, name, timed)
    return orig


def launch_label(self, *tensors):
    return self.kernel.__name__ if hasattr(self.kernel, "__name__") else str(self.kernel)


orig_launch = launch.Launch.__call__


def timed_launch(self, *tensors):
    t = time.perf_counter()
    try:
        return orig_launch(self, *tensors)
    finally:
        label = "Launch " + getattr(self.kernel, "__name__", type(self.kernel).__name__)
        acc[label] += time.perf_counter() - t
        cnt[label] += 1


def run(fn, calls=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    acc.clear()
    cnt.clear()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    total = time.perf_counter() - t
    torch.cuda.synchronize()
    return total / calls * 1e6, {k: (acc[k] / calls * 1e6, cnt[k] / calls) for k in acc}


results = {}
for wrapped in (False, True):
    if wrapped:
        launch.Launch.__call__ = timed_launch
        wrap(inference, "_seen_key", "_seen_key")
        wrap(inference, "_kvcache", "_kvcache")
        wrap(kvcache, "kvcache_attention", "kvcache_attention")
        wrap(kvcache.KVCachePlan, "__call__", "KVCachePlan.__call__")
        wrap(latent.LatentLaunch, "__call__", "LatentLaunch.__call__")
        wrap(latent, "TensorDescriptor", "TensorDescriptor()")
        wrap(common, "empty", "common.empty")
        wrap(kvcache, "raise_pending", "raise_pending")
        wrap(kvcache.cu_seqlens, "flag", "cu_seqlens.flag")
        wrap(torch, "empty", "torch.empty")
    for batch in (8, 64):
        kv = torch.randn(batch, 4096, 1, 576, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(batch, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.full((batch,), 4096, device="cuda", dtype=torch.int32)
        for backend in ("gluon", "triton"):
            flashattn2.set_backend(backend)
            fn = functools.partial(flash_attn_with_kvcache, q, kv, kv[..., :512], cache_seqlens=seqlens)
            total, parts = run(fn)
            key = f"batch {batch} {backend} {'wrapped' if wrapped else 'plain'}"
            results[key] = dict(total_us=total, parts=parts)
            print(key, f"{total:.1f} us/call", flush=True)
            for k, (us, n) in sorted(parts.items(), key=lambda kv: -kv[1][0]):
                print(f"    {k:28s} {us:7.1f} us  x{n:.0f}", flush=True)
# the raw pieces: torch.empty of the partials, a bare combine launch, the latent launch with prebuilt descriptors
flashattn2.set_backend("gluon")
import os  # noqa: E402

with open(os.path.join(os.environ.get("OUT", "."), "latent_layers.json"), "w") as f:
    json.dump(results, f, indent=1)
