"""Write the sm_90 PTX of the main kernels to a directory, compiled without a GPU, so that a refactor
can show it left the generated code alone:

    PYTHONPATH=src python scripts/ptx_snapshot.py /tmp/ptx_before    # then again after the change
    python scripts/ptx_snapshot.py --compare /tmp/ptx_before /tmp/ptx_after

The Gluon kernels need a Triton with Gluon (3.6 is what the GPU machines run). Modules are looked up
under their current paths first, then under the flat kernels/ layout of before issue 25, so that one
script snapshots both. --compare drops debug lines (.loc, .file, the $L__tmp labels only the line table uses, .debug_*
sections) before comparing.
"""

import argparse
import importlib
import inspect
import os
import re
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)
FLOAT_ARGS = {"qk_scale", "softmax_scale", "softcap_in2", "softcap_out", "dropout_p"}
FP32_POINTERS = {"Lse", "Delta", "AlibiSlopes", "QDescale", "KDescale", "VDescale"}
INT_POINTERS = {"CuSeqlensQ", "CuSeqlensK", "Seed", "Flag", "CacheSeqlens", "CacheLeftpad", "CacheBatchIdx",
                "BlockTable"}
# (batch, row, head) stride triples and the (batch, head) pair of the row statistics, one tuple argument each
TUPLE_ARGS = {**dict.fromkeys(("stride_q", "stride_k", "stride_v", "stride_o", "stride_do", "stride_dq", "stride_dk",
                               "stride_dv", "stride_k_new", "stride_v_new"), 3), "stride_lse": 2}
PLAIN = dict(HAS_LEFT=False, HAS_RIGHT=False, IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False,
             HAS_DROPOUT=False, USE_TMA=False, INTERPRET=False)


def module(*names: str):
    """The first of these kernels/ modules that imports (new layout first, then the old one)."""
    for name in names:
        try:
            return importlib.import_module(f"flashattn2.kernels.{name}")
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(names)


def triton_ptx(fn, constexprs: dict, num_warps: int, num_stages: int, types: dict | None = None,
               unused: tuple = ()) -> str:
    """types: argument -> type where the defaults (bf16 pointers, i32 ints) do not hold; unused: pointer
    arguments passed as None."""
    constexprs = {**constexprs, **dict.fromkeys(unused)}
    if "Sink" in fn.arg_names and "Sink" not in constexprs and not (types and "Sink" in types):
        constexprs["Sink"] = None  # a call without learnable sinks passes None, as every launch but theirs does
    for param in fn.params:  # constexpr defaults (LONG_ROWS, IS_FP8, ...) as a launch leaves them
        if param.is_constexpr and param.name not in constexprs and param.default is not inspect.Parameter.empty:
            constexprs[param.name] = param.default
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif types and name in types:
            sig[name] = types[name]
        elif name in TUPLE_ARGS:
            sig[name] = ("i32",) * TUPLE_ARGS[name]
        elif name in FLOAT_ARGS:
            sig[name] = "fp32"
        elif name.startswith("stride") or name.islower():
            sig[name] = "i32"
        else:
            sig[name] = "*fp32" if name in FP32_POINTERS else "*i32" if name in INT_POINTERS else "*bf16"
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages}).asm["ptx"]


def triton_variants():
    fwd = module("portable.forward", "forward").attention_fwd_kernel
    bwd = module("portable.backward", "backward")
    kvc = module("portable.kvcache", "kvcache")
    vl = module("portable.v_layout", "v_layout")
    fwd_unused = ("CuSeqlensQ", "CuSeqlensK", "AlibiSlopes", "Seed", "QDescale", "KDescale", "VDescale")
    bwd_unused = ("CuSeqlensQ", "CuSeqlensK", "AlibiSlopes", "Seed")

    def d(hd, bm, bn, **kw):
        return dict(PLAIN, HEAD_DIM=hd, BLOCK_D=hd, BLOCK_M=bm, BLOCK_N=bn, **kw)

    def desc(bm, hd, dtype="bf16"):
        return f"tensordesc<{dtype}[1,{bm},1,{hd}]>"

    every = dict(HAS_LEFT=True, HAS_RIGHT=True, IS_VARLEN=True, HAS_SOFTCAP=True, HAS_ALIBI=True, HAS_DROPOUT=True)
    yield "triton-fwd-d128", lambda: triton_ptx(fwd, d(128, 64, 64), 4, 3, unused=fwd_unused)
    yield "triton-fwd-d64-causal", lambda: triton_ptx(fwd, d(64, 128, 64, HAS_RIGHT=True), 8, 3, unused=fwd_unused)
    yield "triton-fwd-d64-all-flags", lambda: triton_ptx(
        fwd, d(64, 64, 64, **every), 4, 3, unused=("QDescale", "KDescale", "VDescale"))
    yield "triton-fwd-d128-tma", lambda: triton_ptx(
        fwd, d(128, 64, 64, USE_TMA=True), 4, 3, {"K": desc(64, 128), "V": desc(64, 128)}, fwd_unused)
    yield "triton-fwd-d128-fp8", lambda: triton_ptx(
        fwd, d(128, 128, 128, IS_FP8=True, V_T=True), 8, 3,
        {"Q": "*fp8e4nv", "K": "*fp8e4nv", "V": "*fp8e4nv", "stride_vd": "i32"},
        ("CuSeqlensQ", "CuSeqlensK", "AlibiSlopes", "Seed"))
    yield "triton-dkdv-d128", lambda: triton_ptx(
        bwd.attention_bwd_dkdv_kernel, d(128, 64, 64, ATOMIC_DQ=False, TMA_DQ=False), 4, 2, unused=bwd_unused)
    yield "triton-dkdv-d64-all-flags", lambda: triton_ptx(
        bwd.attention_bwd_dkdv_kernel, d(64, 32, 128, ATOMIC_DQ=True, TMA_DQ=False, **every), 4, 3,
        {"dQ": "*fp32"})
    yield "triton-dkdv-d128-tma", lambda: triton_ptx(
        bwd.attention_bwd_dkdv_kernel, d(128, 64, 64, ATOMIC_DQ=True, TMA_DQ=True, USE_TMA=True), 4, 2,
        {"Q": desc(64, 128), "dOut": desc(64, 128), "dQ": desc(64, 128, "fp32")}, bwd_unused)
    yield "triton-dq-d128", lambda: triton_ptx(bwd.attention_bwd_dq_kernel, d(128, 64, 64), 4, 2, unused=bwd_unused)
    yield "triton-dq-d64-all-flags", lambda: triton_ptx(bwd.attention_bwd_dq_kernel, d(64, 128, 64, **every), 8, 2)
    yield "triton-dq-d128-tma", lambda: triton_ptx(
        bwd.attention_bwd_dq_kernel, d(128, 64, 64, USE_TMA=True), 4, 2,
        {"K": desc(64, 128), "V": desc(64, 128)}, bwd_unused)
    yield "triton-bwd-preprocess-d128-varlen-zero", lambda: triton_ptx(
        bwd.bwd_preprocess_kernel, dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_M=64, IS_VARLEN=True, ZERO_DQ=True), 4, 3,
        {"DqAcc": "*fp32"}, tuple(a for a in ("Lse", "DSink") if a in bwd.bwd_preprocess_kernel.arg_names))
    # with learnable sinks: dsink summed in the preprocess
    if "DSink" in bwd.bwd_preprocess_kernel.arg_names:
        yield "triton-bwd-preprocess-d64-sink", lambda: triton_ptx(
            bwd.bwd_preprocess_kernel, dict(HEAD_DIM=64, BLOCK_D=64, BLOCK_M=64, IS_VARLEN=False, ZERO_DQ=True), 4, 3,
            {"DqAcc": "*fp32", "Lse": "*fp32", "Sink": "*fp32", "DSink": "*fp32"}, ("CuSeqlensQ",))
    kv_flags = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_M=16, BLOCK_N=64, G=4, G_PAD=4, NUM_SPLITS=4, HAS_LEFT=False,
                    HAS_RIGHT=True, IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_SEQLENS=True,
                    HAS_LEFTPAD=False, HAS_BATCH_IDX=False, PAGED=True, INTERPRET=False)
    yield "triton-kvcache-d128-paged-splits", lambda: triton_ptx(
        kvc.kvcache_attention_kernel, kv_flags, 4, 2,
        {"Out": "*fp32", "stride_o": ("i32",) * 4, "stride_lse": ("i32",) * 4},
        ("CacheLeftpad", "CacheBatchIdx", "CuSeqlensQ", "AlibiSlopes", "QDescale", "KDescale", "VDescale"))
    yield "triton-v-keys-last-relabel", lambda: triton_ptx(
        vl.v_keys_last_kernel, dict(HEAD_DIM=128, BLOCK_K=128, BLOCK_D=128, RELABEL=True), 4, 1,
        {"V": "*u8", "Out": "*u8"})


def gluon_variants():
    fwd = module("sm90.forward", "fwd_sm90")
    bwd = module("sm90.backward", "bwd_sm90")
    yield "gluon-fwd-d128-bf16", lambda: fwd.compile_for_sm90(128, torch.bfloat16).asm["ptx"]
    yield "gluon-fwd-d128-fp8", lambda: fwd.compile_for_sm90(128, torch.float8_e4m3fn).asm["ptx"]
    yield "gluon-fwd-d128-bf16-causal-varlen", lambda: fwd.compile_for_sm90(
        128, torch.bfloat16, HAS_RIGHT=True, IS_VARLEN=True, REVERSE_M=True).asm["ptx"]
    yield "gluon-fwd-d64-fp16-softcap-alibi-window", lambda: fwd.compile_for_sm90(
        64, torch.float16, HAS_SOFTCAP=True, HAS_ALIBI=True, HAS_LEFT=True).asm["ptx"]
    for hd in (64, 128, 256):
        for fused in (True, False):
            yield f"gluon-bwd-d{hd}-fused{int(fused)}", lambda hd=hd, fused=fused: bwd.compile_for_sm90(
                hd, torch.bfloat16, FUSED_DQ=fused).asm["ptx"]
    yield "gluon-bwd-d128-causal-varlen", lambda: bwd.compile_for_sm90(
        128, torch.float16, HAS_RIGHT=True, IS_VARLEN=True).asm["ptx"]


def strip_debug(ptx: str) -> str:
    ptx = re.sub(r"\.section\s+\.debug_\w+\s*\{.*?\}", "", ptx, flags=re.S)
    return "\n".join(line for line in ptx.splitlines()
                     if not re.match(r"\s*(\.loc|\.file)\b|\s*\$L__tmp\d+:", line) and line.strip())


def snapshot(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    variants = list(triton_variants())
    try:
        gluon = module("sm90.gluon_api", "gluon_api")
        variants += list(gluon_variants()) if gluon.AVAILABLE else []
    except ImportError:
        pass
    for name, compile_ptx in variants:
        try:
            ptx = compile_ptx()
        except Exception as e:  # noqa: BLE001 - report and go on; the comparison shows it as missing
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}")
            continue
        with open(os.path.join(out, f"{name}.ptx"), "w") as f:
            f.write(ptx)
        print(f"{name}: {len(ptx.splitlines())} lines")
    print(f"triton {triton.__version__}")


def compare(a: str, b: str) -> int:
    names = sorted(set(os.listdir(a)) | set(os.listdir(b)))
    differ = 0
    for name in names:
        pa, pb = os.path.join(a, name), os.path.join(b, name)
        if not (os.path.exists(pa) and os.path.exists(pb)):
            print(f"{name}: only in {a if os.path.exists(pa) else b}")
            differ += 1
            continue
        with open(pa) as fa, open(pb) as fb:
            ta, tb = strip_debug(fa.read()), strip_debug(fb.read())
        same = ta == tb
        differ += not same
        print(f"{name}: {'identical' if same else 'DIFFERS'} ({len(ta.splitlines())} lines)")
    return differ


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?", help="directory for the .ptx files")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two snapshots")
    args = p.parse_args()
    if args.compare:
        sys.exit(1 if compare(*args.compare) else 0)
    if not args.out:
        p.error("give an output directory or --compare")
    snapshot(args.out)


if __name__ == "__main__":
    main()
