"""python -m flashattn2.warmup: compile the common kernel variants into Triton's on-disk cache.

The kernels compile on first use, once per variant, and Triton keeps the result in its cache
(TRITON_CACHE_DIR, by default ~/.triton/cache). A variant is the dtype, head dim, causal or not and
the features, and, because Triton specialises integer arguments on divisibility by 16 (and on the
value 1), the divisibility class of the sizes: seqlens and head counts that are multiples of 16 share
one variant, others get their own. So warm with your model's head counts (--nheads, --nheads-k) and
a seqlen of the same class as yours (--seqlen). Run this once per machine (or in a container build)
to take the compile off the first training step.
"""

import argparse
import itertools
import sys
import time

import torch

from .interface import flash_attn_func, flash_attn_varlen_func

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def warmup(dtypes=("bf16",), head_dims=(64, 128), causal=(False, True), varlen=True, backward=True,
           nheads: int = 16, nheads_k: int | None = None, seqlen: int = 128, device: str = "cuda",
           verbose: bool = True) -> float:
    """Run one small forward (and backward) per variant; returns the seconds it took."""
    start = time.perf_counter()
    for name, head_dim, is_causal, packed in itertools.product(dtypes, head_dims, causal,
                                                              (False, True) if varlen else (False,)):
        t0 = time.perf_counter()
        heads = (nheads, nheads_k or nheads, nheads_k or nheads)
        q, k, v = (torch.randn((2 * seqlen, h, head_dim) if packed else (2, seqlen, h, head_dim),
                               dtype=DTYPES[name], device=device, requires_grad=backward) for h in heads)
        if packed:
            cu = torch.tensor([0, seqlen, 2 * seqlen], dtype=torch.int32, device=device)
            out = flash_attn_varlen_func(q, k, v, cu, cu, seqlen, seqlen, causal=is_causal)
        else:
            out = flash_attn_func(q, k, v, causal=is_causal)
        if backward:
            out.sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        if verbose:
            print(f"{name} head dim {head_dim} {'causal' if is_causal else 'full'}{' varlen' if packed else ''}: "
                  f"{time.perf_counter() - t0:.2f} s", flush=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashattn2.warmup", description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["bf16"])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--causal", choices=("0", "1", "both"), default="both")
    p.add_argument("--nheads", type=int, default=16, help="query heads of your model (16)")
    p.add_argument("--nheads-k", type=int, help="key/value heads (GQA; default: --nheads)")
    p.add_argument("--seqlen", type=int, default=128, help="a seqlen of your shapes' class mod 16 (128)")
    p.add_argument("--no-varlen", action="store_true", help="skip flash_attn_varlen_func's variants")
    p.add_argument("--forward-only", action="store_true", help="inference: skip the backward kernels")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (Triton compiles for the GPU it runs on)", file=sys.stderr)
        return 2
    causal = {"0": (False,), "1": (True,), "both": (False, True)}[args.causal]
    total = warmup(args.dtypes, args.head_dims, causal, not args.no_varlen, not args.forward_only, args.nheads,
                   args.nheads_k, args.seqlen)
    print(f"done in {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
