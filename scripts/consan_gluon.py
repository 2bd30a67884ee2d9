"""Triton's concurrency sanitizer (ConSan) over the Gluon forward on a few shapes: it instruments every
shared-memory access, barrier and async copy and stops the kernel on a race or a barrier misuse.
Run on an sm_90 GPU: python scripts/consan_gluon.py"""

import os

os.environ["TRITON_INSTRUMENTATION_MODE"] = "consan"  # read when a kernel compiles

import torch  # noqa: E402
import triton  # noqa: E402

import flashattn2  # noqa: E402
from flashattn2 import flash_attn_func  # noqa: E402

# ConSan keeps its state in a scratch buffer that the launcher asks torch for
triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))

SHAPES = [
    # batch, seqlen, heads, head_dim, causal: the last two have more work items than SMs (persistent loop)
    (1, 300, 2, 128, True),
    (1, 513, 2, 128, False),
    (2, 1024, 8, 64, False),
    (1, 2048, 16, 128, False),
    (1, 257, 2, 256, True),
]

for batch, seqlen, heads, head_dim, causal in SHAPES:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flashattn2.set_backend("gluon")
    out = flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
    flashattn2.set_backend("triton")
    ref = flash_attn_func(q, k, v, causal=causal)
    err = (out.float() - ref.float()).abs().max().item()
    print(f"consan clean: b{batch} s{seqlen} h{heads} d{head_dim} causal={causal}, max |gluon - triton| {err:.2e}",
          flush=True)
