"""One call each of the Gluon forward (d128 bf16, 1k and 16k) and of both dK/dV kernels (16k), for Nsight
Compute: ncu --section SpeedOfLight --section WarpStateStats -k regex:'attention' python scripts/profile_gluon.py"""

import torch

import flashattn2
from flashattn2 import flash_attn_func

for backend, seqlen, causal in (("auto", 1024, False), ("auto", 16384, False), ("auto", 16384, True),
                                ("gluon", 16384, False), ("triton", 16384, False)):
    flashattn2.set_backend(backend)
    batch, heads = 16384 // seqlen, 16
    q, k, v = (torch.randn(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    for _ in range(2):  # the second call is the one to read (compiled, warm)
        out = flash_attn_func(q, k, v, causal=causal)
        if backend != "auto" or seqlen == 1024:
            out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
