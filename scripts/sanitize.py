"""Small calls of every kernel family, to run under NVIDIA's compute-sanitizer (issue 30), on a GPU:

    python scripts/sanitize.py --family all          # once outside the sanitizer: compiles, checks the results
    compute-sanitizer --tool memcheck --error-exitcode 1 python scripts/sanitize.py --family fwd-triton
    compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 1 \\
        python scripts/sanitize.py --family bwd-gluon
    bash scripts/sanitize.sh                         # every family under memcheck, then racecheck; logs in $OUT

Each family runs a few calls chosen to reach its edge paths (cut tiles, empty sequences, GQA, several work items
per program of the persistent Gluon grid) and checks each output against the float64 reference, so that a run
outside the sanitizer is a correctness run too. The Gluon kernels sync through mbarriers, which racecheck may not
model: read its reports against the barrier protocols in kernels/sm90/ before calling them races (ConSan,
scripts/consan_gluon.py, models them)."""

import argparse
import sys

import torch

import flashattn2
from flashattn2 import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from flashattn2.reference import attention_ref

DEVICE = "cuda"


def _close(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float = 2e-2) -> None:
    err = (out.double() - ref.double()).abs().max().item()
    if not err <= tol:
        raise AssertionError(f"{name}: max error {err:.3e} > {tol}")


def _dense(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype=torch.bfloat16, grad=False):
    q = torch.randn(batch, seqlen_q, heads, head_dim, device=DEVICE, dtype=dtype, requires_grad=grad)
    k, v = (torch.randn(batch, seqlen_k, heads_k, head_dim, device=DEVICE, dtype=dtype, requires_grad=grad)
            for _ in range(2))
    return q, k, v


def _fwd_bwd(name, q, k, v, backward=True, **kwargs):
    out = flash_attn_func(q, k, v, **kwargs)
    ref, _ = attention_ref(q.detach(), k.detach(), v.detach(), **{k_: v_ for k_, v_ in kwargs.items()
                                                                  if k_ != "deterministic"})
    _close(name, out, ref)
    if backward:
        out.backward(torch.randn_like(out))
        for x in (q, k, v):
            assert torch.isfinite(x.grad).all(), f"{name}: non-finite gradient"


def fwd_triton():
    flashattn2.set_backend("triton")
    for causal, window, softcap in ((False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (False, (33, 7), 5.0)):
        q, k, v = _dense(2, 77, 130, 4, 2, 64)
        _fwd_bwd("fwd-triton", q, k, v, backward=False, causal=causal, window_size=window, softcap=softcap)
    # the key tiles as one loop (FwdConfig.one_loop): d64 causal's short rows and d256 causal's main row, with a
    # cut last key tile and more keys than queries
    for head_dim, seqlen_q in ((64, 200), (256, 77)):
        q, k, v = _dense(2, seqlen_q, 250, 4, 2, head_dim)
        _fwd_bwd("fwd-triton one loop", q, k, v, backward=False, causal=True)


def bwd_triton():
    flashattn2.set_backend("triton")
    for deterministic in (False, True):
        q, k, v = _dense(2, 77, 130, 4, 2, 128, grad=True)
        _fwd_bwd("bwd-triton", q, k, v, causal=True, deterministic=deterministic)


def fwd_gluon():
    # 16 heads x 2048 rows: 256 work items of 128 rows over a persistent grid of one program per SM (several
    # items each), non-causal; then causal (the scheduled grid) and a packed batch with a cut last tile
    flashattn2.set_backend("gluon")
    for causal in (False, True):
        q, k, v = _dense(1, 2048, 2048, 16, 4, 128)
        _fwd_bwd("fwd-gluon", q, k, v, backward=False, causal=causal)
    lens = [300, 0, 1000]
    cu = torch.tensor([0] + lens, device=DEVICE).cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(sum(lens), 4, 64, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    for i, n in enumerate(lens):
        if n:
            s = slice(int(cu[i]), int(cu[i]) + n)
            _close("fwd-gluon varlen", out[s][None], attention_ref(q[s][None], k[s][None], v[s][None],
                                                                   causal=True)[0])


def bwd_gluon():
    flashattn2.set_backend("gluon")
    for head_dim, causal in ((64, True), (128, False), (256, True)):
        q, k, v = _dense(1, 300, 300, 4, 2, head_dim, grad=True)
        _fwd_bwd("bwd-gluon", q, k, v, causal=causal)
    q, k, v = _dense(1, 300, 300, 4, 2, 128, grad=True)
    _fwd_bwd("bwd-gluon deterministic", q, k, v, causal=True, deterministic=True)


def fp8():
    # d128 causal, then the Triton FP8 rows of the twenty-eighth and twenty-ninth sessions (d64 / d256 causal as one
    # loop, non-causal 64-row tiles with 128 or 64 keys)
    cases = [(128, True), (64, True), (256, True), (64, False), (128, False), (256, False)]
    for backend in ("triton", "gluon"):
        flashattn2.set_backend(backend)
        for head_dim, causal in cases if backend == "triton" else cases[:1]:
            q, k, v = _dense(2, 200, 300, 4, 2, head_dim)
            q8, k8, v8, q_descale, k_descale, v_descale = flashattn2.quantize_fp8(q, k, v)
            out = flash_attn_func(q8, k8, v8, causal=causal, q_descale=q_descale, k_descale=k_descale,
                                  v_descale=v_descale)
            _close(f"fp8-{backend} d{head_dim} causal={causal}", out, attention_ref(q, k, v, causal=causal)[0],
                   tol=1e-1)


def kvcache():
    flashattn2.set_backend("auto")
    batch, heads, heads_k, head_dim, capacity = 3, 8, 2, 128, 512
    k_cache, v_cache = (torch.randn(batch, capacity, heads_k, head_dim, device=DEVICE, dtype=torch.bfloat16)
                        for _ in range(2))
    seqlens = torch.tensor([1, 200, 500], device=DEVICE, dtype=torch.int32)
    for num_splits in (1, 4):
        q = torch.randn(batch, 1, heads, head_dim, device=DEVICE, dtype=torch.bfloat16)
        out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, num_splits=num_splits)
        for b, n in enumerate(seqlens.tolist()):
            ref, _ = attention_ref(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n])
            _close(f"kvcache splits={num_splits}", out[b:b + 1], ref)
    # paged (page 16), with appended keys and rotary
    pages = [x.view(batch * capacity // 16, 16, heads_k, head_dim).clone() for x in (k_cache, v_cache)]
    table = torch.randperm(batch * capacity // 16, device=DEVICE).to(torch.int32).view(batch, -1)
    k_new, v_new = (torch.randn(batch, 2, heads_k, head_dim, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    cos, sin = (torch.randn(capacity, head_dim // 4, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(batch, 2, heads, head_dim, device=DEVICE, dtype=torch.bfloat16)
    out = flash_attn_with_kvcache(q, *pages, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                  block_table=table, causal=True)
    assert torch.isfinite(out).all(), "kvcache paged: non-finite output"


def flex():
    for backend in ("triton", "auto"):
        flashattn2.set_backend(backend)
        q, k, v = (torch.randn(1, 4, 384, 128, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        mask = flashattn2.create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki < 200), None, None, 384, 384,
                                            device=DEVICE)
        out = flashattn2.flex_attention(q, k, v, block_mask=mask)
        out.backward(torch.randn_like(out))
        assert all(torch.isfinite(x.grad).all() for x in (q, k, v)), f"flex-{backend}: non-finite gradient"


def sinks_mla():
    flashattn2.set_backend("auto")
    q, k, _ = _dense(2, 70, 90, 4, 2, 192, grad=True)
    v = torch.randn(2, 90, 2, 128, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    sink = torch.randn(4, device=DEVICE, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    _close("sinks-mla", out, attention_ref(q.detach(), k.detach(), v.detach(), causal=True,
                                           learnable_sink=sink.detach())[0])
    out.backward(torch.randn_like(out))


def mla_gluon():
    # the Gluon 192/128 forward and backward (Q and K in 64-column chunks), causal, cut tiles, GQA
    flashattn2.set_backend("gluon")
    q, k, _ = _dense(1, 200, 200, 4, 2, 192, grad=True)
    v = torch.randn(1, 200, 2, 128, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    _fwd_bwd("mla-gluon", q, k, v, causal=True)


def latent():
    # sm90/latent.py: MLA decoding over one latent cache (value = the key cache's first 512 channels), 128 heads,
    # lengths that cut tiles, dense with and without splits, then pages of 64
    flashattn2.set_backend("gluon")
    batch, capacity = 2, 256
    cache = torch.randn(batch, capacity, 1, 576, device=DEVICE, dtype=torch.bfloat16)
    seqlens = torch.tensor([37, 200], device=DEVICE, dtype=torch.int32)
    q = torch.randn(batch, 1, 128, 576, device=DEVICE, dtype=torch.bfloat16)
    for num_splits in (1, 3):
        out = flash_attn_with_kvcache(q, cache, cache[..., :512], cache_seqlens=seqlens, num_splits=num_splits)
        for b, n in enumerate(seqlens.tolist()):
            ref, _ = attention_ref(q[b:b + 1], cache[b:b + 1, :n], cache[b:b + 1, :n, :, :512])
            _close(f"latent splits={num_splits}", out[b:b + 1], ref)
    pages = cache.view(batch * capacity // 64, 64, 1, 576)
    table = torch.arange(batch * capacity // 64, device=DEVICE, dtype=torch.int32).flip(0).view(batch, -1)
    out = flash_attn_with_kvcache(q, pages, pages[..., :512], cache_seqlens=seqlens, block_table=table)
    assert torch.isfinite(out).all(), "latent paged: non-finite output"


FAMILIES = {"fwd-triton": fwd_triton, "bwd-triton": bwd_triton, "fwd-gluon": fwd_gluon, "bwd-gluon": bwd_gluon,
            "fp8": fp8, "kvcache": kvcache, "flex": flex, "sinks-mla": sinks_mla, "mla-gluon": mla_gluon,
            "latent": latent}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["all", *FAMILIES], nargs="+", default=["all"])
    args = ap.parse_args()
    torch.manual_seed(0)
    for name, run in FAMILIES.items():
        if "all" in args.family or name in args.family:
            run()
            torch.cuda.synchronize()
            print(f"{name}: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
