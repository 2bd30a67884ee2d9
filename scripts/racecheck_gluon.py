"""Small Gluon backward calls for NVIDIA's compute-sanitizer (shared-memory races), on an sm_90 GPU:

    python scripts/racecheck_gluon.py    # once, to compile outside the sanitizer
    compute-sanitizer --tool racecheck --racecheck-report all --kernel-name regex:attention_bwd_sm90 \\
        python scripts/racecheck_gluon.py

One work item of 130 keys (two query tiles, the second cut) at head dims 128 (non-causal) and 64 (causal),
and three 64-key items at 256. The kernel syncs through mbarriers, which racecheck may not model: read any report
against the barrier protocol in kernels/sm90/backward.py before calling it a race."""

import torch

import flashattn2
from flashattn2 import flash_attn_func

flashattn2.set_backend("gluon")
for head_dim, causal in ((128, False), (64, True), (256, False)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 130, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = flash_attn_func(q, k, v, causal=causal)
    out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print("done")
