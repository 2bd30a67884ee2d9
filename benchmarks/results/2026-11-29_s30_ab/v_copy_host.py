"""Host time of FP8's V copy alone (v_keys_last), the least of 7 batches of 500 calls, on a small V (the GPU time
stays below the host's) and the benches' V (d128, 16k tokens, hidden 2048)."""
import sys
import time

import torch

from flashattn2.kernels.portable.v_layout import v_keys_last

tag = sys.argv[1]
for shape in ((1, 128, 1, 64), (32, 512, 16, 128)):
    v = torch.randn(shape, device="cuda").to(torch.float8_e4m3fn)
    for _ in range(50):
        v_keys_last(v)
    best = float("inf")
    for _ in range(7):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(500):
            v_keys_last(v)
        best = min(best, time.perf_counter() - t)
    torch.cuda.synchronize()
    print(f"{tag} v_keys_last {shape}: host {best / 500 * 1e6:.2f} us a call", flush=True)
