import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashattn2.kernels.params import AttnOptions
from flashattn2.kernels.sm90 import forward as fwd_sm90
from flashattn2.kernels.portable import forward
for seqlen, hdim in ((512, 128), (512, 64)):
    b, h = 16384 // seqlen, 2048 // hdim
    q, k, v = (torch.randn(b, seqlen, h, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    opts = AttnOptions(softmax_scale=hdim ** -0.5, window_left=-1, window_right=0)
    plan = fwd_sm90.Sm90ForwardPlan(q, k, v, opts)
    tri = forward.forward_plan(q, k, v, opts)
    for _ in range(2):
        plan(q, k, v, opts); tri(q, k, v, opts)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    torch.cuda.synchronize()
