"""Interleaved A/B of the 192/128 (MLA) Gluon forward's tuning on an sm_90 GPU: causal, 16 heads, 16k tokens per
batch at 2k-16k, each variant timed twice in the order A B ... A B, cuDNN and FlexAttention (torch.compile'd, causal
block mask) in the same run.

    PYTHONPATH=src python scripts/ab_mla_fwd.py NAME:KEY=VALUE[+KEY=VALUE] ...

Each NAME runs CONFIGS_MLA[(192, 128)] with those keys over it (PERSISTENT_CAUSAL goes to CONFIGS_MLA_CAUSAL), e.g.
`l2s4:L2_SECTIONS=4 nopp:PINGPONG=False`. Prints one JSON line of median ms per length.
"""

import functools
import json
import sys

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import flashattn2
from flashattn2 import flash_attn_func
from flashattn2.kernels.sm90 import forward as fwd

DIMS = (192, 128)
FLEX = torch.compile(flex_attention)


def _value(text: str):
    return int(text) if text.lstrip("-").isdigit() else text == "True"


def _cudnn(qt, kt, vt):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)


def _median_ms(fn) -> float:
    return round(triton.testing.do_bench(fn, warmup=20, rep=80, return_mode="median"), 4)


def main(argv: list[str]) -> None:
    variants = {"default": {}}
    for arg in argv:
        name, _, keys = arg.partition(":")
        variants[name] = {k: _value(v) for k, v in (x.split("=") for x in keys.split("+"))}
    base, base_causal = dict(fwd.CONFIGS_MLA[DIMS]), dict(fwd.CONFIGS_MLA_CAUSAL[DIMS])
    backend = flashattn2.get_backend()
    try:
        for seqlen in (2048, 4096, 8192, 16384):
            print(json.dumps(_row(seqlen, variants, base, base_causal)), flush=True)
    finally:  # the tables and the backend as they were, also after a failed variant
        fwd.CONFIGS_MLA[DIMS], fwd.CONFIGS_MLA_CAUSAL[DIMS] = base, base_causal
        flashattn2.set_backend(backend)


def _row(seqlen: int, variants: dict, base: dict, base_causal: dict) -> dict:
    """Median ms of cuDNN and of each variant (twice, interleaved) at one length."""
    batch = 16384 // seqlen
    q, k = (torch.randn(batch, seqlen, 16, 192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16)
    cudnn = functools.partial(_cudnn, *(x.transpose(1, 2).contiguous() for x in (q, k, v)))
    row = {"seqlen": seqlen, "cudnn": _median_ms(cudnn)}
    try:  # a peer users have today; a failure to compile is recorded, not fatal
        block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seqlen, seqlen, device="cuda")
        flex = functools.partial(FLEX, *(x.transpose(1, 2).contiguous() for x in (q, k, v)), block_mask=block_mask,
                                 scale=192 ** -0.5)
        flex()
        row["flex"] = _median_ms(flex)
    except Exception as exc:
        row["flex"] = str(exc).splitlines()[0][:200] if str(exc) else repr(exc)
    ours = functools.partial(flash_attn_func, q, k, v, causal=True)
    for rnd in (1, 2):
        for name, over in variants.items():
            fwd.CONFIGS_MLA[DIMS] = dict(base, **{k: v for k, v in over.items() if k != "PERSISTENT_CAUSAL"})
            fwd.CONFIGS_MLA_CAUSAL[DIMS] = dict(base_causal, **{k: v for k, v in over.items()
                                                                if k == "PERSISTENT_CAUSAL"})
            flashattn2.set_backend("gluon")  # drops the plans made with the last tuning
            ours()
            row[f"{name}_{rnd}"] = _median_ms(ours)
    return row


if __name__ == "__main__":
    main(sys.argv[1:])
