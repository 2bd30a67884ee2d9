"""Calls of the Gluon kernels for Nsight Compute, each made twice (read the second: compiled, warm):

    ncu --section SpeedOfLight --section WarpStateStats -k regex:'attention' python scripts/profile_gluon.py
    ncu --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:'attention_bwd' \\
        python scripts/profile_gluon.py --case mla

--case d128 (the default): the forward (d128 bf16, 1k and 16k) and both dK/dV kernels (16k). --case mla: MLA's 192/128
forward and backward, causal, 16 heads, 16k tokens (the backward's dQ bulk reduce-adds: benchmarks/NOTES.md).
--case latent: the Gluon latent-decoding kernel (576/512, 128 heads, batch 64, 16k cache), where its warps stall:

    ncu --section WarpStateStats --section SourceCounters -k regex:latent \\
        python scripts/profile_gluon.py --case latent

(--latent-tuning P_APART=1 profiles a LATENT_TUNING variant, e.g. one a tried diff adds.)

--case mla2k: the MLA backward at 2k (8 x 2048, causal), where it trails cuDNN most. --case d64c: the d64 causal
forward at 512 (32 x 512, 32 heads), Gluon, the Triton forward (what auto runs there), then cuDNN's:

    ncu --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \\
        -k regex:'attention|cudnn|fmha|sdpa' python scripts/profile_gluon.py --case d64c

--case d64nc: the same calls without the causal mask (Gluon's three consumers are what auto runs there).
--case d128c: the d128 causal forward at 512 (32 x 512, 16 heads) on the Gluon forward, the d128 cell furthest
below cuDNN; --fwd-tuning KEY=V+... over CONFIGS[128] (a prepared key such as ITEM_OVERLAP=1, once applied).
--case pipes: non-causal forwards whose exp2 count per matmul FLOP is highest (d64 FP8 and bf16 at 4k, what auto
runs), FP8 d128 at 16k (Gluon), and cuDNN's bf16 d64 at 4k, for the pipes' use (MUFU against the tensor cores):

    ncu --section ComputeWorkloadAnalysis --section InstructionStats --section SpeedOfLight \
        -k regex:'attention|cudnn|fmha|sdpa' python scripts/profile_gluon.py --case pipes"""

import argparse

import torch

import flashattn2
from flashattn2 import flash_attn_func


def d128() -> None:
    for backend, seqlen, causal in (("auto", 1024, False), ("auto", 16384, False), ("auto", 16384, True),
                                    ("gluon", 16384, False), ("triton", 16384, False)):
        flashattn2.set_backend(backend)
        batch, heads = 16384 // seqlen, 16
        q, k, v = (torch.randn(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        for _ in range(2):
            out = flash_attn_func(q, k, v, causal=causal)
            if backend != "auto" or seqlen == 1024:
                out.backward(torch.ones_like(out))
        torch.cuda.synchronize()


def mla(batch: int = 1, seqlen: int = 16384) -> None:
    q, k = (torch.randn(batch, seqlen, 16, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    v = torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in range(2):
        out = flash_attn_func(q, k, v, causal=True)
        out.backward(torch.randn_like(out))
    torch.cuda.synchronize()


def latent(tuning: str = "") -> None:
    from tuning_spec import parse

    from flashattn2 import flash_attn_with_kvcache
    from flashattn2.kernels.sm90 import latent as kernel

    # --latent-tuning over LATENT_TUNING (a variant under test, e.g. a tried diff's key)
    kernel.LATENT_TUNING.update(parse(tuning, kernel.LATENT_TUNING))
    flashattn2.set_backend("gluon")
    cache = torch.randn(64, 16384, 1, 576, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(64, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((64,), 16384, device="cuda", dtype=torch.int32)
    for _ in range(2):
        flash_attn_with_kvcache(q, cache, cache[..., :512], cache_seqlens=seqlens)
    torch.cuda.synchronize()


def d128c(tuning: str = "") -> None:
    from tuning_spec import parse

    from flashattn2.kernels.sm90 import forward as kernel

    kernel.CONFIGS[128] = dict(kernel.CONFIGS[128], **parse(tuning, kernel.CONFIGS[128]))
    flashattn2.set_backend("gluon")
    q, k, v = (torch.randn(32, 512, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(2):
        flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()


def d64(causal: bool = True, tuning: str = "") -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from tuning_spec import parse

    from flashattn2.kernels.sm90 import forward as kernel

    # --fwd-tuning over the entry the call takes last (CONFIGS_CAUSAL's or CONFIGS_NONCAUSAL's, over CONFIGS')
    table = kernel.CONFIGS_CAUSAL if causal else kernel.CONFIGS_NONCAUSAL
    table[64] = dict(table[64], **parse(tuning, kernel.CONFIGS[64]))
    # the package bench's shape (16k tokens, hidden 2048: 32 heads of 64)
    q, k, v = (torch.randn(32, 512, 32, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for backend in ("gluon", "triton"):
        flashattn2.set_backend(backend)
        for _ in range(2):
            flash_attn_func(q, k, v, causal=causal)
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # the peer, on its own (batch, heads, seqlen, dim) layout
        for _ in range(2):
            torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    torch.cuda.synchronize()


def pipes() -> None:
    from host_vs_gpu import bench_inputs
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for head_dim, seqlen, fp8 in ((64, 4096, True), (64, 4096, False), (128, 16384, True)):
        q, k, v, descales = bench_inputs(head_dim, seqlen, fp8)
        for _ in range(2):
            flash_attn_func(q, k, v, **descales)
    qt, kt, vt = (torch.randn(4, 32, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(2):
            torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)
    torch.cuda.synchronize()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python scripts/profile_gluon.py", description=__doc__.split("\n")[0])
    parser.add_argument("--latent-tuning", default="", help="--case latent: LATENT_TUNING keys, KEY=V joined with +")
    parser.add_argument("--fwd-tuning", default="",
                        help="--case d128c: CONFIGS[128] keys; d64c / d64nc: CONFIGS[64]'s; KEY=V joined with +")
    # each case by name, given the parsed arguments (its choices are these names)
    cases = {"d128": lambda a: d128(), "mla": lambda a: mla(), "latent": lambda a: latent(a.latent_tuning),
             "mla2k": lambda a: mla(8, 2048), "d64c": lambda a: d64(True, a.fwd_tuning),
             "d64nc": lambda a: d64(False, a.fwd_tuning), "d128c": lambda a: d128c(a.fwd_tuning),
             "pipes": lambda a: pipes()}
    parser.add_argument("--case", choices=tuple(cases), default="d128")
    args = parser.parse_args()
    cases[args.case](args)
