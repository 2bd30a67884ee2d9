"""python benchmarks/bench_fp8.py: the FP8 (e4m3) attention forward against our bf16 forward and an FP8 matmul.

Speed: TFLOP/s of the forward at head dims 64, 128, 256, causal and not, seqlen 1k to 16k with 16k tokens per
batch and hidden 2048, next to the FP8 and bf16 matmul rates at 8192^3 (torch._scaled_mm, torch.mm) measured in
the same run. Accuracy (head dim 128, seqlen 4k, 16 heads): max error against float64 on the dequantised inputs
(ours, and PyTorch with FP8 matmuls: reference.attention_fp8_ref) and against float64 on the bf16 originals
(ours in FP8, ours in bf16, PyTorch in bf16), on random data and with outlier channels (10-100x) in k and v.
The FP8 forward is timed as flash_attn_func runs it (the backend "auto" picks; V copied per call into the layout FP8
tensor cores read), on the Triton kernel, and the V copy alone.
--sweep first times tile configurations of the Gluon FP8 kernel (Hopper) at 8k, its plan called with its V copy. Writes
<stem>_fp8.json; its markdown and PNG come from benchmarks/report_fp8.py.
"""

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch

from flashattn2.bench import collect_meta, default_stem

TOKENS, HIDDEN = 16384, 2048
SEQLENS = (1024, 2048, 4096, 8192, 16384)
# Gluon FP8 tuning per head dim: (BLOCK_N, STAGES, PINGPONG)
SWEEP = {
    64: [(128, 4, False), (256, 3, False), (256, 3, True)],
    128: [(128, 4, True), (128, 4, False), (256, 2, True), (256, 2, False)],
    256: [(64, 4, False), (128, 2, True), (128, 2, False)],
}


def _ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _qkv(batch, seqlen, nheads, head_dim, outliers=False):
    q, k, v = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if outliers:
        channels = torch.randperm(head_dim)[:3]
        for x in (k, v):  # keys and values; q's too would square the outliers in the scores
            x[..., channels] *= torch.tensor([10.0, 30.0, 100.0], device="cuda", dtype=torch.bfloat16)
    return q, k, v


def matmul_rates(n: int = 8192) -> dict:
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # _scaled_mm takes b column-major
    one = torch.ones((), device="cuda")
    fp8 = _ms(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    a16, b16 = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bf16 = _ms(lambda: torch.mm(a16, b16))
    flops = 2 * n**3
    return {"n": n, "fp8_tflops": flops / fp8 / 1e9, "bf16_tflops": flops / bf16 / 1e9}


def sweep(head_dims) -> list[dict]:
    from flashattn2 import quantize_fp8
    from flashattn2.kernels.params import AttnOptions

    # kernel internals: the sweep launches the Gluon FP8 plan with tile settings the public API does not take
    from flashattn2.kernels.sm90.forward import Sm90ForwardPlan

    rows = []
    for head_dim in head_dims:
        seqlen = 8192
        q8, k8, v8, *descales = quantize_fp8(*_qkv(TOKENS // seqlen, seqlen, HIDDEN // head_dim, head_dim))
        for causal in (False, True):
            opts = AttnOptions(softmax_scale=head_dim**-0.5, window_right=0 if causal else -1)
            flops = 4 * TOKENS * seqlen * HIDDEN / (2 if causal else 1)
            for cfg in SWEEP.get(head_dim, []):
                try:
                    tuning = dict(BLOCK_N=cfg[0], STAGES=cfg[1], PINGPONG=cfg[2])
                    plan = Sm90ForwardPlan(q8, k8, v8, opts, tuning)
                    ms = _ms(partial(plan, q8, k8, v8, opts, tuple(descales)))
                    row = {"head_dim": head_dim, "causal": causal, "config": cfg, "tflops": flops / ms / 1e9,
                           "with_v_copy": True}
                except Exception as exc:  # a tile that does not fit is a result
                    row = {"head_dim": head_dim, "causal": causal, "config": cfg, "error": str(exc)[:120]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def speed(head_dims, seqlens) -> list[dict]:
    from flashattn2 import attention_backend, flash_attn_func, get_backend, quantize_fp8, set_backend

    # kernel internals: the V copy each FP8 kernel makes, timed alone
    from flashattn2.kernels.portable.v_layout import RELABEL_KEYS, keys_last, v_keys_last

    rows = []
    for head_dim in head_dims:
        for causal in (False, True):
            for seqlen in seqlens:
                q, k, v = _qkv(max(1, TOKENS // seqlen), seqlen, HIDDEN // head_dim, head_dim)
                q8, k8, v8, qd, kd, vd = quantize_fp8(q, k, v)
                fp8_call = partial(flash_attn_func, q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,
                                   v_descale=vd)
                choice = get_backend()
                with torch.no_grad():
                    fp8 = _ms(fp8_call)
                    fp8_backend = attention_backend(q8, k8, v8, causal=causal).forward
                    # the share of the call that copies V (each kernel's own layout)
                    v_copy = _ms(partial(v_keys_last, v8, RELABEL_KEYS, True) if fp8_backend == "gluon-sm90"
                                 else partial(keys_last, v8))
                    bf16 = _ms(partial(flash_attn_func, q, k, v, causal=causal))
                    set_backend("triton")
                    try:
                        fp8_triton = _ms(fp8_call)
                    finally:
                        set_backend(choice)
                flops = 4 * q.shape[0] * seqlen * seqlen * HIDDEN / (2 if causal else 1)
                row = {"head_dim": head_dim, "causal": causal, "seqlen": seqlen, "fp8_tflops": flops / fp8 / 1e9,
                       "fp8_triton_tflops": flops / fp8_triton / 1e9, "v_copy_us": v_copy * 1e3,
                       "bf16_tflops": flops / bf16 / 1e9, "fp8_over_bf16": bf16 / fp8,
                       "fp8_backend": fp8_backend,
                       "bf16_backend": attention_backend(q, k, v, causal=causal).forward}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def accuracy() -> list[dict]:
    from flashattn2 import attention_ref, flash_attn_func, quantize_fp8
    from flashattn2.reference import attention_fp8_ref, max_abs_error

    rows = []
    for outliers in (False, True):
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v = _qkv(1, 4096, 16, 128, outliers)
            q8, k8, v8, qd, kd, vd = quantize_fp8(q, k, v)
            with torch.no_grad():
                ours8 = flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
                ours16 = flash_attn_func(q, k, v, causal=causal)
            deq_ref, _ = attention_fp8_ref(q8, k8, v8, qd, kd, vd, causal=causal)
            base8, _ = attention_fp8_ref(q8, k8, v8, qd, kd, vd, causal=causal, upcast=False)
            row = {"outliers": outliers, "causal": causal, "dequantised": {
                "ours_fp8": max_abs_error(ours8, deq_ref), "pytorch_fp8": max_abs_error(base8, deq_ref)}}
            del deq_ref
            ref, _ = attention_ref(q, k, v, causal=causal)
            pt16, _ = attention_ref(q, k, v, causal=causal, upcast=False)
            row["original"] = {"ours_fp8": max_abs_error(ours8, ref), "pytorch_fp8": max_abs_error(base8, ref),
                               "ours_bf16": max_abs_error(ours16, ref), "pytorch_bf16": max_abs_error(pt16, ref),
                               "out_max": ref.abs().max().item()}
            print(json.dumps(row), flush=True)
            rows.append(row)
            del ref, pt16, base8
            torch.cuda.empty_cache()
    return rows


def write(result: dict, out_dir: Path, stem: str) -> Path:
    """<stem>_fp8.json (the markdown and PNG: python benchmarks/report_fp8.py <stem>_fp8.json)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}_fp8.json"
    path.write_text(json.dumps(result, indent=1))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_fp8.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--tag", default=None)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlens", type=int, nargs="+", default=list(SEQLENS))
    parser.add_argument("--sweep", action="store_true", help="time tile configurations first")
    parser.add_argument("--no-accuracy", dest="accuracy", action="store_false")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: the FP8 benchmark needs one", file=sys.stderr)
        return 2
    result = {"sweep": sweep(args.head_dims) if args.sweep else [], "matmul": matmul_rates()}
    print(json.dumps(result["matmul"]), flush=True)
    result["speed"] = speed(args.head_dims, args.seqlens)
    result["accuracy"] = accuracy() if args.accuracy else []
    meta = collect_meta(torch.cuda.get_device_name(), argv, prog="python benchmarks/bench_fp8.py")
    meta.update(tokens_per_batch=TOKENS, hidden=HIDDEN)
    result = {"meta": meta, **result}
    stem = args.tag or default_stem(torch.cuda.get_device_name())
    print(f"wrote {write(result, Path(args.out_dir), stem)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
