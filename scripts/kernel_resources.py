"""Compile the plain-path kernels for sm_90 on a machine without a GPU and print their resources.

    python scripts/kernel_resources.py

Registers and stack bytes per thread (stack > 0 means spills) come from cuobjdump -res-usage on the
cubin Triton builds for the named target, HGMMA and cp.async (LDGSTS) counts from its SASS: no device time
needed. The numbers are those of the Triton installed here, which may differ from the device machine's.
Each argument is specialised as a launch of the benchmark shapes specialises it (Triton's launcher marks 16-byte
aligned pointers and integers divisible by 16): without those marks the loads cannot become cp.async, the key
loop is not pipelined, and the kernel compiled is one the GPU never runs (the d64 causal forward: 254 registers,
16 KB of shared memory, no LDGSTS, against 128 registers, 56 KB, 48 LDGSTS; triton 3.6, 2026-11-28).
"""

import inspect
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from flashattn2.kernels.portable.backward import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel
from flashattn2.kernels.portable.forward import attention_fwd_kernel

FLOAT_ARGS = {"qk_scale", "softmax_scale", "softcap_in2", "softcap_out", "dropout_p"}
FP32_POINTERS = {"Lse", "Delta"}
OPTIONAL_POINTERS = ("CuSeqlensQ", "CuSeqlensK", "AlibiSlopes", "Seed", "QDescale", "KDescale", "VDescale", "Sink")
# (batch, row, head) stride triples and the (batch, head) pair of the row statistics: one tuple argument each
TUPLE_ARGS = {"stride_lse": 2}
PLAIN = dict(HAS_LEFT=False, IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False, USE_TMA=False,
             INTERPRET=False)


def _signature(fn, constexprs: dict, descriptors: dict, fp8: bool = False) -> dict:
    """fp8: Q, K and V in e4m3 with fp32 descales (IS_FP8), the rest as for bf16."""
    sig = {}
    for name in fn.arg_names:
        if name in descriptors:
            sig[name] = f"tensordesc<{'fp32' if name == 'dQ' else 'bf16'}{list(descriptors[name])}>"
        elif name in constexprs:
            sig[name] = "constexpr"
        elif name in FLOAT_ARGS:
            sig[name] = "fp32"
        elif name.startswith("stride_") and name != "stride_alibi_b" and name != "stride_vd":
            sig[name] = ("i32",) * TUPLE_ARGS.get(name, 3)
        elif name.startswith("stride") or name.islower():
            sig[name] = "i32"
        elif fp8 and name in ("Q", "K", "V"):
            sig[name] = "*fp8e4nv"
        else:
            sig[name] = "*fp32" if name in FP32_POINTERS or (fp8 and name.endswith("Descale")) else "*bf16"
    return sig


def launch_attrs(fn, signature: dict) -> dict:
    """The divisibility marks a launch of the benchmark shapes gives: every pointer 16-byte aligned, every stride
    and sequence length a multiple of 16 (tuple arguments element by element)."""
    attrs = {}
    for i, name in enumerate(fn.arg_names):
        kind = signature[name]
        if isinstance(kind, str) and (kind == "constexpr" or kind.startswith("tensordesc")):
            continue
        if isinstance(kind, tuple):
            attrs.update({(i, j): [["tt.divisibility", 16]] for j in range(len(kind))})
        elif kind.startswith("*") or name.startswith("stride") or name in ("seqlen_q", "seqlen_k"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def resources(fn, constexprs: dict, num_warps: int, num_stages: int, descriptors: dict | None = None) -> str:
    """descriptors: argument name -> block shape, for tensors passed as TMA descriptors (USE_TMA)."""
    fp8 = bool(constexprs.get("IS_FP8"))
    optional = [n for n in OPTIONAL_POINTERS if n in fn.arg_names and not (fp8 and n.endswith("Descale"))]
    constexprs = {**constexprs, **{name: None for name in optional}}
    for param in fn.params:  # constexpr defaults (LONG_ROWS, IS_FP8, ...) as a launch leaves them
        if param.is_constexpr and param.name not in constexprs and param.default is not inspect.Parameter.empty:
            constexprs[param.name] = param.default
    signature = _signature(fn, constexprs, descriptors or {}, fp8)
    src = ASTSource(fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
                    attrs=launch_attrs(fn, signature))
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", usage, re.S)
    # QGMMA: FP8 wgmma
    return (f"regs {m.group(1):>3}  stack {m.group(2):>4}  HGMMA {sass.count('HGMMA'):>3}  "
            f"QGMMA {sass.count('QGMMA'):>3}  LDGSTS {sass.count('LDGSTS'):>3}  shared {kernel.metadata.shared}")


def forward_rows() -> list[tuple]:
    """(fp8, causal, head dim, FwdConfig) of every row of the Triton forward's Hopper tables (configs.py)."""
    from flashattn2.kernels.portable import configs

    rows = {(False, causal, d, cfg) for causal, table in configs._HOPPER_FWD.items() for d, cfg in table}
    rows |= {(fp8, causal, d, cfg) for (fp8, causal), table in configs._HOPPER_FWD_SHORT.items()
             for d, _, cfg in table}
    rows |= {(True, causal, d, cfg) for causal, table in configs._HOPPER_FWD_FP8.items() for d, cfg in table}
    return sorted(rows, key=str)


def forward_row_resources(fp8: bool, causal: bool, head_dim: int, cfg) -> str:
    """resources() of one forward row as a launch of it compiles (FP8: V keys-last)."""
    assert not cfg.use_tma, "a row with tensor descriptors: hand resources() its descriptors"
    flags = dict(PLAIN, HAS_RIGHT=causal, HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_M=cfg.block_m,
                 BLOCK_N=cfg.block_n, ONE_LOOP=cfg.one_loop, IS_FP8=fp8, V_T=fp8)
    return resources(attention_fwd_kernel, flags, cfg.num_warps, cfg.num_stages)


def main() -> None:
    # every row of the forward's Hopper tables (configs.py), then dK/dV and dQ tiles the sweeps compared
    for fp8, causal, hd, cfg in forward_rows():
        tiles = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
        print(f"{'fp8 ' if fp8 else 'fwd '} d={hd:<3} causal={int(causal)} {tiles} one_loop={int(cfg.one_loop)}: "
              f"{forward_row_resources(fp8, causal, hd, cfg)}", flush=True)
    for hd, (bm, bn, w, s) in [(64, (32, 128, 4, 3)), (64, (32, 128, 8, 2)), (64, (64, 64, 8, 2)),
                               (128, (64, 64, 4, 2)), (128, (64, 128, 8, 2)), (128, (32, 64, 4, 2))]:
        flags = dict(PLAIN, HAS_RIGHT=False, HEAD_DIM=hd, BLOCK_D=hd, BLOCK_M=bm, BLOCK_N=bn, ATOMIC_DQ=False,
                     TMA_DQ=False)
        print(f"dkdv d={hd:<3} {(bm, bn, w, s)}: {resources(attention_bwd_dkdv_kernel, flags, w, s)}")
    for hd, (bm, bn, w, s) in [(64, (128, 64, 8, 2)), (128, (128, 32, 4, 3)), (128, (64, 64, 4, 2))]:
        flags = dict(PLAIN, HAS_RIGHT=False, HEAD_DIM=hd, BLOCK_D=hd, BLOCK_M=bm, BLOCK_N=bn)
        print(f"dq   d={hd:<3} {(bm, bn, w, s)}: {resources(attention_bwd_dq_kernel, flags, w, s)}")


if __name__ == "__main__":
    main()
