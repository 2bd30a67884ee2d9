"""The Hopper Gluon forward (kernels/sm90/forward.py) and the backend seam (kernels/backends.py).

On CPU: every kernel variant compiles for sm_90 with the installed Triton (the interpreter cannot run
Gluon), and the compiled code has what the design needs. On an sm_90 GPU: the backend choice, a stress
test of the pipeline against the float64 reference, and bitwise repeatability. The rest of the suite
runs through the Gluon forward on sm_90 by default, and on the Triton one with FLASHATTN2_BACKEND=triton.
"""

import os
import re
import subprocess

import pytest
import torch

import flashattn2
from flashattn2 import attention_backend, flash_attn_func, flash_attn_varlen_func
from flashattn2.kernels import backends
from flashattn2.kernels.sm90.gluon_api import AVAILABLE
from helpers import ON_GPU, check_attention, check_varlen, randn

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="this Triton has no Gluon")

VARIANTS = [
    # (head_dim, dtype, flags)
    (64, torch.bfloat16, {}),
    (128, torch.bfloat16, {}),
    (256, torch.bfloat16, {}),
    (128, torch.float16, {"HAS_RIGHT": True, "REVERSE_M": True}),
    (64, torch.float16, {"HAS_LEFT": True, "HAS_RIGHT": True}),
    (256, torch.bfloat16, {"HAS_RIGHT": True, "REVERSE_M": True, "IS_VARLEN": True}),
    # with ping-pong (d128, d256) a score transform spills 28-44 bytes under triton 3.6 (benchmarks/NOTES.md)
    (128, torch.bfloat16, {"HAS_SOFTCAP": True, "HAS_LEFT": True, "MAY_SPILL": True}),
    (256, torch.float16, {"HAS_ALIBI": True, "HAS_RIGHT": True, "MAY_SPILL": True}),
    (64, torch.bfloat16, {"HAS_SOFTCAP": True, "HAS_ALIBI": True, "IS_VARLEN": True}),
    (128, torch.bfloat16, {"HAS_SOFTCAP": True, "HAS_ALIBI": True, "HAS_LEFT": True, "MAY_SPILL": True}),
    # the backward (sm90/backward.py): with dQ in the kernel, a score transform or 128-row query tiles (d64) spill
    # under triton 3.6 (benchmarks/NOTES.md); FUSED_DQ=0 is the deterministic dK/dV-only kernel
    (128, torch.bfloat16, {"BWD": True}),
    # dK/dV through a layout change (COALESCED_DKV) spill 44 bytes in the causal packed variant; it measured 7%
    # faster on eight packed 4k documents all the same (benchmarks/NOTES.md)
    (128, torch.float16, {"BWD": True, "HAS_RIGHT": True, "IS_VARLEN": True, "MAY_SPILL": True}),
    (128, torch.bfloat16, {"BWD": True, "HAS_SOFTCAP": True, "HAS_ALIBI": True, "HAS_LEFT": True,
                           "MAY_SPILL": True}),
    (128, torch.bfloat16, {"BWD": True, "FUSED_DQ=0": True}),
    (64, torch.bfloat16, {"BWD": True, "MAY_SPILL": True}),
    # the same without `.maxnreg` (FREE_REGS): the consumers' 240 registers, no spills
    (64, torch.bfloat16, {"BWD": True, "FREE_REGS=1": True}),
    (64, torch.float16, {"BWD": True, "HAS_RIGHT": True, "IS_VARLEN": True, "FUSED_DQ=0": True}),
    (128, torch.float16, {"BWD": True, "FUSED_DQ=0": True, "HAS_RIGHT": True, "IS_VARLEN": True}),
    # a value head dim unlike the query's (MLA 192/128): Q and K in three 64-column tiles, O by pointer stores
    (192, torch.bfloat16, {"head_dim_v=128": True}),
    (192, torch.float16, {"head_dim_v=128": True, "HAS_RIGHT": True, "REVERSE_M": True, "IS_VARLEN": True}),
    # and its backward: 128-key items (CONFIGS_MLA: 32-row query tiles, dQᵀ = Kᵀ dSᵀ, FREE_REGS); 116 bytes of
    # spills outside the query-tile loop under triton 3.6
    (192, torch.bfloat16, {"BWD": True, "head_dim_v=128": True, "MAY_SPILL": True}),
    (192, torch.float16, {"BWD": True, "head_dim_v=128": True, "HAS_RIGHT": True, "IS_VARLEN": True,
                          "MAY_SPILL": True}),
    (192, torch.bfloat16, {"BWD": True, "head_dim_v=128": True, "FUSED_DQ=0": True, "MAY_SPILL": True}),
    # dense causal calls of at most 8k rows: the scheduled persistent grid (CONFIGS_MLA_SHORT_CAUSAL), its table
    # holding each item's place (PLACED_SCHEDULE)
    (192, torch.bfloat16, {"BWD": True, "head_dim_v=128": True, "HAS_RIGHT": True, "SCHEDULED": True,
                           "PLACED_SCHEDULE=1": True, "MAY_SPILL": True}),
    # the dQ reduce-adds from the consumers (CONFIGS_MLA's producer issues them, DQ_WRITER), one chunk at a time
    (192, torch.bfloat16, {"BWD": True, "head_dim_v=128": True, "DQ_WRITER=0": True, "DQ_PAIR=0": True,
                           "HAS_RIGHT": True, "MAY_SPILL": True}),
    # dK/dV stored from the accumulators (CONFIGS_MLA stores them through shared memory, COALESCED_DKV)
    (192, torch.bfloat16, {"BWD": True, "head_dim_v=128": True, "COALESCED_DKV=0": True, "HAS_RIGHT": True,
                           "MAY_SPILL": True}),
    # the 64-key items kept to compare (CONFIGS_MLA_NARROW: Q and K in 64-column tiles of [rows, 256] buffers)
    (192, torch.bfloat16, {"BWD": True, "head_dim_v=128": True, "SPLIT_D=1": True, "BLOCK_M=64": True,
                           "STAGES=2": True, "FREE_REGS=0": True}),
    (192, torch.float16, {"BWD": True, "head_dim_v=128": True, "SPLIT_D=1": True, "BLOCK_M=64": True,
                          "STAGES=2": True, "FREE_REGS=0": True, "HAS_RIGHT": True, "IS_VARLEN": True}),
    # head dim 256: 64-key programs, the warpgroups split the head dim (SPLIT_D)
    (256, torch.bfloat16, {"BWD": True}),
    (256, torch.float16, {"BWD": True, "HAS_RIGHT": True, "IS_VARLEN": True}),
    (256, torch.bfloat16, {"BWD": True, "HAS_SOFTCAP": True, "HAS_ALIBI": True, "HAS_LEFT": True}),
    (256, torch.bfloat16, {"BWD": True, "FUSED_DQ=0": True, "HAS_RIGHT": True}),
    # a persistent causal grid's schedule table (PERSISTENT_CAUSAL, prepared, off): 44 bytes of spills under
    # triton 3.6, as the causal kernel without the table
    (128, torch.bfloat16, {"BWD": True, "HAS_RIGHT": True, "SCHEDULED": True, "MAY_SPILL": True}),
    # a persistent causal grid's schedule table (the default for dense causal calls)
    (128, torch.bfloat16, {"HAS_RIGHT": True, "REVERSE_M": True, "SCHEDULED": True, "SEPARATE_O=1": True,
                           "STAGES=2": True, "Q_STAGES=2": True, "LAZY_O_WAIT=1": True}),
    # and d64's, whose first key tile skips its mask where every row sees it whole (FIRST_FULL)
    (64, torch.bfloat16, {"HAS_RIGHT": True, "REVERSE_M": True, "SCHEDULED": True, "SEPARATE_O=1": True,
                          "Q_STAGES=2": True, "LAZY_O_WAIT=1": True, "FIRST_FULL=1": True}),
    # three consumer warpgroups, 192-row items (CONSUMERS=3, the default of dense non-causal d64 calls)
    # with a consumer whose rows all lie past the end walking the tiles without matmuls (IDLE_SKIP)
    (64, torch.bfloat16, {"THREE_CONSUMERS": True, "Q_STAGES=2": True, "FREE_REGS=1": True, "IDLE_SKIP=1": True}),
    # (24 and 256 bytes of spills at 160 registers a consumer, triton 3.6's ptxas)
    (64, torch.bfloat16, {"THREE_CONSUMERS": True, "Q_STAGES=2": True, "MAY_SPILL": True}),
    (64, torch.float16, {"THREE_CONSUMERS": True, "HAS_RIGHT": True, "REVERSE_M": True, "SCHEDULED": True,
                         "MAY_SPILL": True}),
    # the same compiled without `.maxnreg` (FREE_REGS: each consumer the 160 registers its setmaxnreg grants): no
    # spills, the launch still within 128 registers a thread
    (64, torch.float16, {"THREE_CONSUMERS": True, "HAS_RIGHT": True, "REVERSE_M": True, "SCHEDULED": True,
                         "FREE_REGS=1": True}),
    (64, torch.bfloat16, {"THREE_CONSUMERS": True, "Q_STAGES=2": True, "FREE_REGS=1": True}),
    # two programs per SM (CTAS_PER_SM=2: the launch's cap 80 registers, the consumers 104; 64-key tiles, since an
    # m64n128 wgmma needs 90 registers against the cap): 24 bytes of stack under triton 3.6, two 8-byte
    # pairs stored and reloaded around each S wgmma
    (64, torch.bfloat16, {"HAS_RIGHT": True, "REVERSE_M": True, "SCHEDULED": True, "CTAS_PER_SM=2": True,
                          "BLOCK_N=64": True, "STAGES=2": True, "MAY_SPILL": True}),
    (64, torch.float16, {"CTAS_PER_SM=2": True, "BLOCK_N=64": True, "STAGES=2": True, "Q_STAGES=2": True,
                         "SEPARATE_O=1": True, "MAY_SPILL": True}),
    # and FP8 d64 (no spills); FP8 d128's PV wgmma, as bf16's, needs more than 80
    (64, torch.float8_e4m3fn, {"HAS_RIGHT": True, "REVERSE_M": True, "SCHEDULED": True, "CTAS_PER_SM=2": True,
                               "BLOCK_N=64": True, "STAGES=2": True, "Q_STAGES=2": True}),
    # O staged apart from Q (SEPARATE_O: the default of dense d64 causal and d128 calls; at d128 with 2 stages)
    (64, torch.bfloat16, {"SEPARATE_O=1": True, "HAS_RIGHT": True, "REVERSE_M": True}),
    (128, torch.float16, {"SEPARATE_O=1": True, "STAGES=2": True, "Q_STAGES=2": True}),
    # the FP8 forward (IS_FP8: e4m3 inputs, P through shared memory); with two Q stages (its dense default) both
    # spill 80 bytes under triton 3.6's ptxas, as they have since two Q stages came in (cb89f3a; NOTES.md)
    (128, torch.float8_e4m3fn, {"Q_STAGES=2": True, "MAY_SPILL": True}),
    (64, torch.float8_e4m3fn, {"HAS_RIGHT": True, "REVERSE_M": True, "SCHEDULED": True, "Q_STAGES=2": True,
                               "MAY_SPILL": True}),
    # FP8 with V transposed in the kernel (V_TRANSPOSE: a staging buffer, the producer's four warps transpose), as
    # the dense causal d128 call's tuning
    (128, torch.float8_e4m3fn, {"V_TRANSPOSE=1": True, "HAS_RIGHT": True, "REVERSE_M": True, "SCHEDULED": True,
                                "BLOCK_N=128": True, "STAGES=4": True, "Q_STAGES=2": True}),
    # packed FP8 batches take Triton; 128-key tiles at d256 spill 12-28 bytes (sm_90, triton 3.9's ptxas), and
    # measured faster than 64-key tiles all the same (benchmarks/NOTES.md)
    (256, torch.float8_e4m3fn, {"HAS_LEFT": True, "HAS_RIGHT": True, "MAY_SPILL": True}),
    (128, torch.float8_e4m3fn, {"HAS_SOFTCAP": True, "HAS_ALIBI": True, "MAY_SPILL": True}),
    # a one-row FP8 call's folded ints (seqlen_q stays unfolded: UNSPECIALIZED), which ptxas 12.8 died on when
    # seqlen_q = 1 was folded in too
    (64, torch.float8_e4m3fn, {"Q_STAGES=2": True, "batch=1": True, "nheads=1": True, "group=1": True,
                               "seqlen_k=1": True, "section=1": True}),
    # learnable sinks folded into the final normalisation (sinks.py)
    (128, torch.bfloat16, {"SINK": True, "HAS_RIGHT": True, "REVERSE_M": True, "SCHEDULED": True}),
    (64, torch.float16, {"SINK": True, "IS_VARLEN": True, "HAS_LEFT": True, "HAS_RIGHT": True}),
    # the block-sparse mode (flex_attention's forward, sm90/flex.py): 4-32 bytes of spills under triton 3.6
    (128, torch.bfloat16, {"BLOCK_SPARSE": True, "REVERSE_M": True, "MAY_SPILL": True}),
    (64, torch.float16, {"BLOCK_SPARSE": True, "REVERSE_M": True, "MAY_SPILL": True}),
    (256, torch.bfloat16, {"BLOCK_SPARSE": True, "REVERSE_M": True, "MAY_SPILL": True}),
    # and the backward's (28 and 120 bytes of spills at d128 and d64 under triton 3.6)
    (128, torch.bfloat16, {"BWD": True, "BLOCK_SPARSE": True, "MAY_SPILL": True}),
    (64, torch.float16, {"BWD": True, "BLOCK_SPARSE": True, "MAY_SPILL": True}),
    (256, torch.bfloat16, {"BWD": True, "BLOCK_SPARSE": True}),
    # with a score_mod compiled in (ScoreMod): ALiBi from a captured slope table forward, softcap backward; both
    # spill under triton 3.6 (760 and 272 bytes, benchmarks/NOTES.md)
    (128, torch.bfloat16, {"BLOCK_SPARSE": True, "REVERSE_M": True, "MOD_ALIBI": True, "MAY_SPILL": True}),
    (128, torch.bfloat16, {"BWD": True, "BLOCK_SPARSE": True, "MOD_SOFTCAP": True, "MAY_SPILL": True}),
]


def test_free_registers_drops_maxnreg_only_while_compiling():
    # the stage hook sits in Triton's knobs only inside the context, chains a hook already there, and edits only
    # PTX that moves registers (setmaxnreg) under a thread count (.reqntid)
    import triton

    from flashattn2.kernels.sm90.common import free_registers, strip_maxnreg

    ws = ".reqntid 384\n.maxnreg 168\n{\nsetmaxnreg.inc.sync.aligned.u32 232;\n}\n"
    assert ".maxnreg" not in strip_maxnreg(ws) and ".reqntid 384" in strip_maxnreg(ws)
    plain = ".reqntid 128\n.maxnreg 255\n{\n}\n"
    assert strip_maxnreg(plain) == plain
    calls = []
    runtime = triton.knobs.runtime
    saved = runtime.add_stages_inspection_hook

    def outer(*args):
        calls.append(len(args))
        return ("outer", "0") if not args else None

    runtime.add_stages_inspection_hook = outer
    try:
        with free_registers():
            hook = runtime.add_stages_inspection_hook
            assert hook is not outer
            stages = {"ptx": lambda src, metadata: src}
            hook(None, stages, None, None, 90)
            assert stages["ptx"](ws, {}) == strip_maxnreg(ws)
            assert hook()[0].startswith("outer")  # the cache key (triton >= 3.7) keeps the outer hook's
        assert runtime.add_stages_inspection_hook is outer and calls == [5, 0]
    finally:
        runtime.add_stages_inspection_hook = saved


def _ptxas_report(ptxas: str, ptx_path: str, tmp_path) -> str:
    run = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx_path, "-o", str(tmp_path / "k.cubin")],
                         capture_output=True, text=True, check=True)
    return run.stderr


# The compile runs in a child process without TRITON_INTERPRET (tests/compile_child.py): under the interpreter the
# shared @triton.jit helpers are interpreted functions, which a Gluon kernel cannot call.
_PTXAS_MARK = "@@ptxas "
_COMPILE = """
import os, sys, torch
os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"  # the compile's own ptxas report (-v), printed when ptxas runs
from triton.backends.nvidia.compiler import get_ptxas
from flashattn2.kernels.sm90 import backward as bwd_sm90, forward as fwd_sm90
from flashattn2.score_mod import compile_score_mod
out, head_dim, dtype, flags = sys.argv[1], int(sys.argv[2]), getattr(torch, sys.argv[3]), sys.argv[4:]
module = bwd_sm90 if "BWD" in flags else fwd_sm90
slopes = torch.rand(16)
mods = dict(MOD_ALIBI=lambda score, b, h, q_idx, kv_idx: score + slopes[h] * (kv_idx - q_idx),
            MOD_SOFTCAP=lambda score, b, h, q_idx, kv_idx: 30.0 * torch.tanh(score / 30.0))
mod = next((compile_score_mod(mods[f], "cpu") for f in flags if f in mods), None)
flags = dict(f.split("=") if "=" in f else (f, 1) for f in flags if f != "BWD" and f not in mods)
flags = {k: bool(int(v)) if v in (1, "0", "1") and k.isupper() else int(v)  # STAGES=2, section=1: numbers
         for k, v in flags.items()}
open(out, "w").write(module.compile_for_sm90(head_dim, dtype, score_mod=mod, **flags).asm["ptx"])
sys.stdout.write("\\n@@ptxas " + get_ptxas(90).path)
"""


@pytest.mark.skipif(ON_GPU, reason="compile-only check for CPU CI; the GPU runs the kernels")
@pytest.mark.parametrize("head_dim,dtype,flags", VARIANTS,
                         ids=[f"d{d}-{str(t)[6:]}-{'-'.join(f).lower() or 'plain'}" for d, t, f in VARIANTS])
def test_gluon_variant_compiles_for_sm90(head_dim, dtype, flags, tmp_path, compile_child):
    flags = dict(flags)
    may_spill = flags.pop("MAY_SPILL", False)
    ptx_path = str(tmp_path / "k.ptx")
    run = compile_child.run(_COMPILE, [ptx_path, str(head_dim), str(dtype)[6:], *flags])
    assert run.returncode == 0, f"the Gluon kernel does not compile for sm_90:\n{run.stderr[-4000:]}"
    with open(ptx_path) as f:
        ptx = f.read()
    assert "wgmma.mma_async" in ptx, "no wgmma: the matmuls fell off the Hopper tensor-core path"
    assert "cp.async.bulk.tensor" in ptx, "no TMA copies"
    assert "setmaxnreg" in ptx, "no register reallocation between producer and consumers"
    # the MLA backward's default (CONFIGS_MLA) compiles free too
    mla_bwd = "BWD" in flags and "head_dim_v=128" in flags
    if "FREE_REGS=1" in flags or (mla_bwd and "FREE_REGS=0" not in flags):
        assert ".maxnreg" not in ptx and ".reqntid" in ptx, "FREE_REGS: the PTX keeps the launch's register cap"
    if "CTAS_PER_SM=2" in flags:  # two 384-thread programs within 65536 registers
        assert re.search(r"^\s*\.maxnreg 80\s*$", ptx, re.MULTILINE), "CTAS_PER_SM=2: not the launch cap of 80"
    # the compile's own report, or (a cache hit runs no ptxas) ptxas run again on the PTX
    log, _, ptxas = run.stdout.rpartition(_PTXAS_MARK)
    report = log if "bytes spill stores" in log else _ptxas_report(ptxas.strip(), ptx_path, tmp_path)
    assert "C7510" not in report and "C7515" not in report, f"ptxas serialised the wgmma pipeline:\n{report}"
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills, report
    import triton

    if triton.__version__.startswith("3.6.") and not may_spill:
        # the Triton the GPU machines run (and PyTorch 2.11 ships) must not spill; newer releases'
        # register allocation is recorded in benchmarks/NOTES.md, not asserted
        assert max(spills) == 0, f"register spills:\n{report}"


def test_backend_choice_off_hopper_and_override():
    q = randn(1, 64, 2, 128, dtype=torch.bfloat16)
    on_hopper = ON_GPU and torch.cuda.get_device_capability() == (9, 0)
    try:
        flashattn2.set_backend("auto")  # the suite may run with the backend forced through the environment
        choice = attention_backend(q, q, q, causal=True)
        assert (choice.forward == "gluon-sm90") == on_hopper, choice.reason
        assert choice.backward == "triton", "a short causal d128 backward stays on Triton (AUTO_CAUSAL_MIN_ROWS)"
        choice = attention_backend(q, q, q)
        assert (choice.backward == "gluon-sm90") == on_hopper, choice.reason
        flashattn2.set_backend("triton")
        assert attention_backend(q, q, q) == ("triton", "triton", "forward: FLASHATTN2_BACKEND=triton; "
                                              "backward: FLASHATTN2_BACKEND=triton")
    finally:
        flashattn2.set_backend(os.environ.get("FLASHATTN2_BACKEND", "auto"))
    with pytest.raises(ValueError, match="FLASHATTN2_BACKEND must be one of"):
        flashattn2.set_backend("cudnn")
    assert backends.get_backend() == os.environ.get("FLASHATTN2_BACKEND", "auto")


def test_auto_keeps_short_fp8_calls_on_triton():
    # host-side rule, so it runs anywhere: Gluon for FP8 unless dense (causal or not) and shorter than the measured
    # crossover; other windows keep Gluon
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.kernels.sm90.forward import AUTO_FP8_MIN_ROWS, auto_declines

    masks = {"causal": AttnOptions(softmax_scale=1.0, window_right=0),
             "non-causal": AttnOptions(softmax_scale=1.0)}
    window = AttnOptions(softmax_scale=1.0, window_left=64, window_right=0)
    # the measured crossovers (H200, 2026-11-29, against the Triton FP8 kernel's 64-row tiles; NOTES.md)
    assert AUTO_FP8_MIN_ROWS == {"causal": {64: 16384, 128: 1024, 256: 1024},
                                 "non-causal": {64: 16384, 128: 0, 256: 0}}
    for mask, opts in masks.items():
        for head_dim, rows in AUTO_FP8_MIN_ROWS[mask].items():
            short = torch.empty(1, max(rows - 1, 1), 1, head_dim, dtype=torch.float8_e4m3fn)
            long = torch.empty(1, max(rows, 1), 1, head_dim, dtype=torch.float8_e4m3fn)
            assert auto_declines(long, opts) is None and auto_declines(short, window) is None
            reason = auto_declines(short, opts)
            assert (reason is None) == (rows <= 1)
            assert rows <= 1 or reason.startswith(f"FP8 {mask} with {short.shape[1]} query rows")


def test_auto_and_default_tiles_per_head_dim():
    # host-side choices, so they run anywhere: bf16 head dims 128 and 256 on Gluon, 64 on Triton unless dense,
    # non-causal and long (H100 A/B in benchmarks/NOTES.md); FP8 d128 takes 256-key tiles unless a right window
    # edge (causal) cuts its work items;
    # dense causal calls take the scheduled persistent grid (d128 with O apart and 2 stages), except FP8 d256;
    # packed causal calls keep CONFIGS' entry
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.kernels.sm90 import forward as fwd

    AUTO_D64_MIN_ROWS, CONFIGS, CONFIGS_FP8 = fwd.AUTO_D64_MIN_ROWS, fwd.CONFIGS, fwd.CONFIGS_FP8
    CONFIGS_NONCAUSAL, auto_declines, default_tuning = fwd.CONFIGS_NONCAUSAL, fwd.auto_declines, fwd.default_tuning

    full, causal = AttnOptions(softmax_scale=1.0), AttnOptions(softmax_scale=1.0, window_right=0)
    local = AttnOptions(softmax_scale=1.0, window_left=100, window_right=20)
    cu = torch.tensor([0, 300], dtype=torch.int32)
    packed = causal._replace(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=300, max_seqlen_k=300)
    for head_dim, declined in ((64, True), (128, False), (256, False)):
        q = torch.empty(1, 512, 1, head_dim, dtype=torch.bfloat16)
        assert (auto_declines(q, causal) is not None) == declined
        assert default_tuning(head_dim, False, full) == {**CONFIGS[head_dim], **CONFIGS_NONCAUSAL.get(head_dim, {})}
        assert default_tuning(head_dim, False, packed) == CONFIGS[head_dim]
        assert default_tuning(head_dim, False, causal)["PERSISTENT_CAUSAL"]
        assert default_tuning(head_dim, False, local)["PERSISTENT_CAUSAL"]
    assert default_tuning(128, False, causal)["STAGES"] == 2 and default_tuning(128, False, causal)["SEPARATE_O"]
    # dense non-causal: d64 on three consumers, from AUTO_D64_MIN_ROWS query rows on Gluon; d128 with O apart;
    # both with two Q stages, as dense causal calls at d64 and d128 (with the lazy O wait there)
    assert default_tuning(64, False, full)["CONSUMERS"] == 3 and default_tuning(64, False, causal)["CONSUMERS"] == 2
    # FREE_REGS where it measured faster: d64 dense non-causal only (and the MLA backward, sm90/backward.py)
    assert default_tuning(64, False, full)["FREE_REGS"] and AUTO_D64_MIN_ROWS == 512
    assert not any(default_tuning(d, fp8, o)["FREE_REGS"] for d in (64, 128, 256) for fp8 in (False, True)
                   for o in (causal, packed) + ((full,) if fp8 or d > 64 else ()))
    for head_dim in (64, 128):
        dense, dense_causal = default_tuning(head_dim, False, full), default_tuning(head_dim, False, causal)
        assert dense["Q_STAGES"] == dense_causal["Q_STAGES"] == 2
        assert dense_causal["LAZY_O_WAIT"] and not dense["LAZY_O_WAIT"]
        assert default_tuning(head_dim, False, packed)["Q_STAGES"] == 1
    assert default_tuning(64, True, full)["CONSUMERS"] == 2
    # MLA's 192/128 on Gluon under auto (1.04-1.30x cuDNN, the Triton forward 0.57-0.72x), its own tiles, the
    # scheduled grid when dense and causal
    assert auto_declines(torch.empty(1, 4096, 1, 192, dtype=torch.bfloat16), causal) is None
    assert default_tuning(192, False, full, 128) == fwd.CONFIGS_MLA[(192, 128)]
    assert default_tuning(192, False, causal, 128)["PERSISTENT_CAUSAL"]
    assert not default_tuning(192, False, packed, 128)["PERSISTENT_CAUSAL"]
    assert default_tuning(128, False, full)["SEPARATE_O"] and default_tuning(128, False, full)["STAGES"] == 2
    assert default_tuning(256, False, full) == CONFIGS[256]
    long64 = torch.empty(1, AUTO_D64_MIN_ROWS, 1, 64, dtype=torch.bfloat16)
    assert auto_declines(long64, full) is None and auto_declines(long64[:, 1:], full) is not None
    assert auto_declines(long64, causal) is not None
    # d64 causal from fwd.AUTO_D64_CAUSAL_MIN_ROWS, plain causal only (no left edge)
    long64c = torch.empty(1, fwd.AUTO_D64_CAUSAL_MIN_ROWS, 1, 64, dtype=torch.bfloat16)
    assert fwd.AUTO_D64_CAUSAL_MIN_ROWS == 1024  # H200 2026-11-28: Gluon +1-3% at 1k, +4-5% at 1.5k; 768 -14%
    # dense causal d64 skips the first key tile's mask where every row sees it whole (FIRST_FULL: +1.4-3.2% at
    # 1k-8k, H200 2026-11-28); not d128, d256, non-causal, packed or FP8 calls (level or slower there)
    assert default_tuning(64, False, causal)["FIRST_FULL"] and default_tuning(64, False, local)["FIRST_FULL"]
    assert default_tuning(64, False, causal)["FIRST_FULL_MIN_ROWS"] == 1024  # 512 lost 10% with it
    assert not any(default_tuning(d, False, o).get("FIRST_FULL", False) for d in (128, 256) for o in (full, causal))
    assert not any(default_tuning(64, fp8, o).get("FIRST_FULL", False) for fp8 in (False, True) for o in (full, packed))
    assert not default_tuning(64, True, causal).get("FIRST_FULL", False)
    assert auto_declines(long64c, causal) is None and auto_declines(long64c[:, 1:], causal) is not None
    assert auto_declines(long64c, local) is not None
    # FP8 dense calls take two Q stages at d64 and d128, causal or not
    for head_dim in (64, 128):
        for options in (full, causal):
            assert default_tuning(head_dim, True, options)["Q_STAGES"] == 2
    assert auto_declines(long64.flatten(0, 1), packed._replace(window_right=-1)) is not None
    assert default_tuning(128, True, full)["BLOCK_N"] == 256
    assert default_tuning(128, True, causal)["BLOCK_N"] == default_tuning(128, True, local)["BLOCK_N"] == 128
    assert default_tuning(128, True, causal)["PERSISTENT_CAUSAL"]
    assert default_tuning(64, True, causal)["PERSISTENT_CAUSAL"]
    assert default_tuning(256, True, causal) == CONFIGS_FP8[256]


def test_forward_grid_choice():
    # host-side: a persistent grid without a right window edge, one head after another; causal calls keep one
    # program per item in L2 sections, unless PERSISTENT_CAUSAL and dense (then persistent, with a schedule
    # table); the keys leave the tuning
    from flashattn2.kernels.sm90.forward import CONFIGS, grid_choice

    for head_dim in CONFIGS:
        for right_edge, persistent_causal, varlen, expected in ((False, False, False, (True, "heads")),
                                                                (True, False, False, (False, "sections")),
                                                                (True, True, False, (True, "scheduled")),
                                                                (True, True, True, (False, "sections")),
                                                                (False, True, True, (True, "heads"))):
            tuning = dict(CONFIGS[head_dim], PERSISTENT_CAUSAL=persistent_causal)
            assert grid_choice(tuning, right_edge, varlen) == expected
            assert "PERSISTENT" not in tuning and "PERSISTENT_CAUSAL" not in tuning
    assert grid_choice(dict(PERSISTENT=False, PERSISTENT_CAUSAL=True), True) == (False, "sections")
    assert grid_choice(dict(PERSISTENT=False), False) == (False, "sections")


def test_schedule_gives_every_item_once_and_balances_the_programs():
    # host-side: the persistent causal grid's table (schedule_items over causal_walk_costs) holds every item of
    # the walk once, in walk order per program, and no program's cost exceeds the mean by more than one item's
    import numpy as np

    from flashattn2.kernels.device.tile_order import decoded_schedule, sectioned_items
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.kernels.sm90.forward import causal_walk_costs, schedule_items

    causal = AttnOptions(softmax_scale=1.0, window_right=0)
    for num_blocks, num_bh, section, programs in ((4, 512, 32, 132), (128, 16, 1, 132), (8, 10, 4, 7)):
        seqlen = num_blocks * 128 - 40  # a cut last tile
        costs = causal_walk_costs(num_blocks, num_bh, section, seqlen, seqlen, causal, 128, 128)
        assert costs.max() == num_blocks + 1 and costs.min() == 2  # the longest tile first; one for the prologue
        table = schedule_items(costs, programs)
        offsets, items = table[:programs + 1], table[programs + 1:]
        assert offsets[0] == 0 and offsets[-1] == len(items) == len(costs)
        assert sorted(items.tolist()) == list(range(len(costs)))
        rows = [items[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        loads = [costs[row].sum() for row in rows]
        assert all(np.all(np.diff(row) > 0) for row in rows)
        assert max(loads) - costs.sum() / programs <= costs.max()
        # the kernels' table holds each item worked out: (query block counted from the last, batch, head)
        heads = {512: 4, 16: 16, 10: 5}[num_bh]
        decoded = decoded_schedule(table, programs, num_blocks, num_bh, section, heads, reverse=True)
        assert np.array_equal(decoded[:programs + 1], offsets) and decoded.dtype == np.int64
        block, b, h = ((decoded[programs + 1:] >> 21 * i) & (1 << 21) - 1 for i in range(3))
        assert np.array_equal(costs[items], block + 2)  # causal: block j sees j + 1 key tiles, +1 the prologue
        assert np.array_equal(b * heads + h, sectioned_items(num_blocks, num_bh, section)[1][items])
        assert h.max() == heads - 1 and b.max() == num_bh // heads - 1


def test_auto_backward_per_head_dim_length_and_determinism():
    # host-side, so it runs anywhere: the Gluon backward at head dims 64, 128 and 256 and MLA's 192/128 (H100 A/B
    # in benchmarks/NOTES.md), except causal calls shorter than AUTO_CAUSAL_MIN_ROWS query rows (dense: 512, where
    # the scheduled grid measured 1.25x Triton; packed: 1024) and deterministic calls below head dim 256
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.kernels.sm90.backward import AUTO_CAUSAL_MIN_ROWS, auto_declines

    full, causal = AttnOptions(softmax_scale=1.0), AttnOptions(softmax_scale=1.0, window_right=0)
    for head_dim in (64, 128, 256):
        assert auto_declines(torch.empty(1, 4096, 1, head_dim), full) is None
    assert "head dim 96" in auto_declines(torch.empty(1, 4096, 1, 96), full)
    min_rows = AUTO_CAUSAL_MIN_ROWS[128]
    assert auto_declines(torch.empty(1, min_rows, 1, 128), causal) is None
    assert "right window edge" in auto_declines(torch.empty(1, min_rows - 1, 1, 128), causal)
    assert auto_declines(torch.empty(1, 64, 1, 256), causal) is None  # 1.21x Triton at 512 rows, head dim 256
    assert auto_declines(torch.empty(1, 256, 1, 64), full) is None
    cu = torch.tensor([0, 300, 600], dtype=torch.int32)
    packed = AttnOptions(softmax_scale=1.0, window_right=0, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=300,
                         max_seqlen_k=300)
    assert "300 query rows" in auto_declines(torch.empty(600, 1, 128), packed)
    assert min_rows == 512 and AUTO_CAUSAL_MIN_ROWS[64] == 512
    cu = torch.tensor([0, 600, 1200], dtype=torch.int32)
    packed = AttnOptions(softmax_scale=1.0, window_right=0, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=600,
                         max_seqlen_k=600)
    assert "600 query rows" in auto_declines(torch.empty(1200, 1, 64), packed)  # no schedule for packed calls
    deterministic = AttnOptions(softmax_scale=1.0, deterministic=True)
    assert "deterministic" in auto_declines(torch.empty(1, 4096, 1, 128), deterministic)
    assert auto_declines(torch.empty(1, 4096, 1, 256), deterministic) is None  # 1.2-1.3x Triton at 256
    # MLA's 192/128: the Gluon backward, causal from 2k rows measured; deterministic MLA calls stay on Triton
    assert auto_declines(torch.empty(1, 2048, 1, 192), causal) is None
    assert "deterministic" in auto_declines(torch.empty(1, 2048, 1, 192), deterministic)


hopper = pytest.mark.skipif(not (ON_GPU and torch.cuda.get_device_capability() == (9, 0)),
                            reason="needs an sm_90 GPU")


@pytest.fixture(params=["grid", "persistent"])
def gluon_backend(request, monkeypatch):
    # every head dim on Gluon ("auto" keeps head dim 64 on Triton), with a launch grid of one
    # program per work item and with a persistent grid (each program loops over work items)
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    persistent = request.param == "persistent"
    for name in ("CONFIGS", "CONFIGS_FP8"):
        configs = getattr(fwd_sm90, name)
        monkeypatch.setattr(fwd_sm90, name, {d: dict(c, PERSISTENT=persistent) for d, c in configs.items()})
    flashattn2.set_backend("gluon")
    yield
    flashattn2.set_backend(backends._checked(os.environ.get("FLASHATTN2_BACKEND", "auto")))


@pytest.mark.gpu
@hopper
def test_calls_gluon_cannot_run_fall_back_with_a_reason(gluon_backend):
    q = randn(1, 64, 2, 128, dtype=torch.bfloat16)
    assert attention_backend(q, q, q, dropout_p=0.1)[:2] == ("triton", "triton")
    q96 = randn(1, 64, 2, 96, dtype=torch.bfloat16)
    assert attention_backend(q96, q96, q96).reason == (
        "forward: head dim 96 (the Gluon kernel has [64, 128, 256]); "
        "backward: head dim 96 (the Gluon backward has [64, 128, 256])")
    odd = randn(1, 64, 3, 129, dtype=torch.bfloat16)[..., :128]  # row strides not 16-byte aligned
    assert "TMA" in attention_backend(odd, odd, odd).reason
    q64 = randn(1, 64, 2, 64, dtype=torch.bfloat16)
    assert attention_backend(q64, q64, q64)[0] == "gluon-sm90"
    q8 = q64.to(torch.float8_e4m3fn)
    assert attention_backend(q8, q8, q8, causal=True)[0] == "gluon-sm90"
    flashattn2.set_backend("auto")
    assert attention_backend(q64, q64, q64)[0] == "triton"
    # FP8: Gluon at head dim 64 except short dense calls (fwd_sm90.AUTO_FP8_MIN_ROWS)
    assert attention_backend(q8, q8, q8, window_size=(64, 0))[0] == "gluon-sm90"
    assert "FP8 non-causal with 64 query rows" in attention_backend(q8, q8, q8).reason
    short = attention_backend(q8, q8, q8, causal=True)
    assert short[0] == "triton" and "FP8 causal with 64 query rows" in short.reason
    long8 = randn(1, 16384, 1, 64, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
    assert attention_backend(long8, long8, long8, causal=True)[0] == "gluon-sm90"
    q256 = randn(1, 64, 2, 256, dtype=torch.bfloat16)
    assert attention_backend(q256, q256, q256)[0] == "gluon-sm90"
    assert attention_backend(q, q, q)[:2] == ("gluon-sm90", "gluon-sm90")
    assert attention_backend(q, q, q, softcap=30.0)[0] == "triton"


def _stress_case(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, options, dtype, requires_grad):
    """Fresh random q, k, v of a stress shape, and its options as flash_attn_func (and the reference) take
    them ("alibi": random slopes of the right shape)."""
    options = dict(options)
    torch.manual_seed(seqlen_q * 31 + seqlen_k + head_dim + requires_grad)
    q = randn(batch, seqlen_q, nheads, head_dim, dtype=dtype, requires_grad=requires_grad)
    k = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype, requires_grad=requires_grad)
    v = randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype, requires_grad=requires_grad)
    if options.pop("alibi", False):
        options["alibi_slopes"] = torch.rand(batch, nheads, device=q.device) * 0.3
    return q, k, v, options


def _varlen_case(seed, requires_grad=False, head_dim=128):
    """A packed bf16 batch with empty, one-row and unequal sequences (4 query heads on 2 kv heads):
    (lens_q, lens_k, cu_seqlens_q, cu_seqlens_k, q, k, v)."""
    torch.manual_seed(seed)
    lens_q, lens_k = [1, 300, 129, 64, 0, 517], [5, 250, 129, 700, 3, 517]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                  for lens in (lens_q, lens_k))
    q = randn(sum(lens_q), 4, head_dim, dtype=torch.bfloat16, requires_grad=requires_grad)
    k = randn(sum(lens_k), 2, head_dim, dtype=torch.bfloat16, requires_grad=requires_grad)
    v = randn(sum(lens_k), 2, head_dim, dtype=torch.bfloat16, requires_grad=requires_grad)
    return lens_q, lens_k, cu_q, cu_k, q, k, v


def _forward_stress_and_packed(shape, seed):
    """A STRESS shape, then a packed causal batch of its head dim (_varlen_case(seed)), through flash_attn in bf16
    against float64: the Gluon plan the first call made."""
    q, k, v, options = _stress_case(*shape, dtype=torch.bfloat16, requires_grad=False)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **options)
    plan = next(p for p in backends._plans.values() if hasattr(p, "attend"))
    check_attention(q, k, v, out, lse, None, torch.empty_like(out), **options)
    lens_q, lens_k, cu_q, cu_k, q, k, v = _varlen_case(seed, head_dim=shape[5])
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                         return_attn_probs=True)
    check_varlen(q, k, v, out, lse, None, torch.empty_like(out), cu_q, cu_k, causal=True)
    return plan


def _set_in_every_entry(monkeypatch, module, tables, **keys):
    """These tuning keys in every entry of the module's tuning tables, for one test."""
    for table in tables:
        monkeypatch.setattr(module, table, {d: dict(c, **keys) for d, c in getattr(module, table).items()})


def _fp8_stress(shape):
    """A STRESS shape quantized to FP8 through flash_attn_func, checked by _fp8_check: the Gluon FP8 plan it made."""
    from flashattn2 import quantize_fp8

    q, k, v, options = _stress_case(*shape, dtype=torch.bfloat16, requires_grad=False)
    q8, k8, v8, *descales = quantize_fp8(q, k, v)
    out, lse, _ = flash_attn_func(q8, k8, v8, return_attn_probs=True, q_descale=descales[0], k_descale=descales[1],
                                  v_descale=descales[2], **options)
    _fp8_check(q8, k8, v8, descales, out, lse, **options)
    return next(p for p in backends._plans.values() if hasattr(p, "attend") and p.attend.named["IS_FP8"])


STRESS = [
    # batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, options
    (2, 128, 128, 2, 2, 128, {}),
    (1, 1, 1, 1, 1, 64, {}),
    (3, 65, 257, 4, 1, 128, {"causal": True}),
    (2, 300, 77, 4, 2, 64, {"causal": True}),
    (1, 1000, 1000, 2, 2, 256, {"causal": True}),
    (2, 513, 1031, 6, 3, 128, {"window_size": (100, 30)}),
    (1, 777, 777, 2, 2, 64, {"window_size": (0, 0)}),
    (2, 191, 383, 2, 2, 256, {"softcap": 20.0}),
    (2, 250, 250, 4, 4, 128, {"alibi": True, "causal": True}),
    (1, 129, 4000, 2, 1, 128, {"softmax_scale": 0.3}),
    (1, 4000, 129, 2, 2, 64, {"causal": True, "window_size": (64, -1)}),
]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", STRESS, ids=lambda s: "x".join(map(str, s[:6])) + "-" + "-".join(s[6]))
def test_gluon_forward_stress(dtype, shape, gluon_backend):
    q, k, v, options = _stress_case(*shape, dtype=dtype, requires_grad=False)
    assert attention_backend(q, k, v, **options).forward == "gluon-sm90"
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **options)
    check_attention(q, k, v, out, lse, None, torch.empty_like(out), **options)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("shape", [s for s in STRESS if s[5] == 64] + [(2, 1000, 1000, 4, 2, 64, {"causal": True}),
                                                                    (1, 385, 600, 2, 2, 64, {})],
                         ids=lambda s: "x".join(map(str, s[:6])) + "-" + "-".join(s[6]))
@pytest.mark.parametrize("free_regs", [False, True], ids=["capped", "free-regs"])
def test_gluon_forward_three_consumers(shape, free_regs, gluon_backend, monkeypatch):
    # CONSUMERS=3 (192-row items, FlashAttention-3's d64 tile): both grids (gluon_backend), causal calls on the
    # schedule, against float64; packed batches too; compiled with and without `.maxnreg` (FREE_REGS)
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    three = dict(fwd_sm90.CONFIGS[64], CONSUMERS=3, PINGPONG=False, FREE_REGS=free_regs)
    monkeypatch.setattr(fwd_sm90, "CONFIGS", {**fwd_sm90.CONFIGS, 64: three})
    # dense non-causal calls take CONFIGS_NONCAUSAL's FREE_REGS over CONFIGS': this test's choice instead
    noncausal = {**fwd_sm90.CONFIGS_NONCAUSAL, 64: dict(fwd_sm90.CONFIGS_NONCAUSAL[64], FREE_REGS=free_regs)}
    monkeypatch.setattr(fwd_sm90, "CONFIGS_NONCAUSAL", noncausal)
    flashattn2.set_backend("gluon")
    plan = _forward_stress_and_packed(shape, 7)
    assert plan.attend.named["CONSUMERS"] == 3 and plan.attend.named["FREE_REGS"] == free_regs


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("shape", STRESS + [(3, 512, 512, 8, 8, 128, {"causal": True})], ids=lambda s: "x".join(
    map(str, s[:6])) + "-" + "-".join(s[6]))
def test_gluon_forward_first_tile_unmasked(shape, gluon_backend, monkeypatch):
    # FIRST_FULL: an item's first key tile skips the mask where every row sees it whole; cut tiles (keys' end,
    # windows' left edge, the diagonal) keep it. Both grids, every head dim, against float64; packed batches too
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    _set_in_every_entry(monkeypatch, fwd_sm90, ("CONFIGS", "CONFIGS_MLA", "CONFIGS_FP8", "CONFIGS_CAUSAL"),
                        FIRST_FULL=True, FIRST_FULL_MIN_ROWS=0)  # (CONFIGS_CAUSAL: at any length)
    flashattn2.set_backend("gluon")
    assert _forward_stress_and_packed(shape, 11).attend.named["FIRST_FULL"]
    # FP8: its P goes to the PV matmul through shared memory (a P carried out of the branch came out wrong once)
    assert _fp8_stress(shape).attend.named["FIRST_FULL"]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("shape", STRESS + [(2, 512, 512, 4, 4, 64, {}), (2, 900, 900, 4, 2, 128, {"causal": True})],
                         ids=lambda s: "x".join(map(str, s[:6])) + "-" + "-".join(s[6]))
def test_gluon_forward_idle_consumers_skip_their_matmuls(shape, gluon_backend, monkeypatch):
    # IDLE_SKIP: a consumer whose rows all lie past the sequence's end (an item's second half at 300, 513, 777 or
    # 4000 rows; the third of three d64 consumers at 512) walks the stages and turns without matmuls; its partners'
    # rows must come out as before. Every stress shape, both grids, ping-pong or not, packed batches, FP8
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    _set_in_every_entry(monkeypatch, fwd_sm90, ("CONFIGS", "CONFIGS_FP8"), IDLE_SKIP=True)
    flashattn2.set_backend("gluon")
    plan = _forward_stress_and_packed(shape, 13)
    assert plan.attend.named["IDLE_SKIP"]
    if shape[6] == {} and shape[5] == 64 and shape[1] == 512:
        assert plan.attend.named["CONSUMERS"] == 3  # 192-row items: the last one's third consumer idles
    assert _fp8_stress(shape).attend.named["IDLE_SKIP"]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("seqlen", [1023, 1024])
def test_gluon_forward_d64_causal_first_tile_unmasked_from_its_rows(seqlen, gluon_backend):
    # the default dense causal d64 tuning: FIRST_FULL from FIRST_FULL_MIN_ROWS query rows (at 512 it lost 10%)
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    assert fwd_sm90.CONFIGS_CAUSAL[64]["FIRST_FULL_MIN_ROWS"] == 1024
    flashattn2.set_backend("gluon")
    q, k, v, options = _stress_case(2, seqlen, seqlen, 4, 2, 64, {"causal": True}, dtype=torch.bfloat16,
                                    requires_grad=False)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **options)
    plan = next(p for p in backends._plans.values() if hasattr(p, "attend"))
    assert plan.attend.named["FIRST_FULL"] == (seqlen >= 1024)
    check_attention(q, k, v, out, lse, None, torch.empty_like(out), **options)


def test_wide_and_three_consumer_tunings_refuse_what_they_cannot_run():
    # host-side: WIDE (one 8-warp consumer partition) takes two consumers and no ping-pong, FP8 or MLA; three
    # consumers neither FP8 nor ping-pong; each refusal names the key
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.kernels.sm90.forward import Sm90ForwardPlan

    q = k = v = torch.empty(1, 128, 2, 64, dtype=torch.bfloat16)
    opts = AttnOptions(softmax_scale=0.125, window_left=-1, window_right=0)
    for tuning, key in ((dict(WIDE=True, PINGPONG=True), "WIDE"), (dict(WIDE=True, CONSUMERS=3), "WIDE"),
                        (dict(CONSUMERS=3, PINGPONG=True), "CONSUMERS=3")):
        with pytest.raises(ValueError, match=key):
            Sm90ForwardPlan(q, k, v, opts, tuning)
    q = k = torch.empty(1, 128, 2, 192, dtype=torch.bfloat16)  # MLA's 192/128
    with pytest.raises(ValueError, match="WIDE"):
        Sm90ForwardPlan(q, k, v.new_empty(1, 128, 2, 128), opts, dict(WIDE=True, PINGPONG=False))


WIDE_SHAPES = [s for s in STRESS if s[5] in (64, 128)] + [(3, 512, 512, 8, 8, 64, {"causal": True})]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("shape", WIDE_SHAPES, ids=lambda s: "x".join(map(str, s[:6])) + "-" + "-".join(s[6]))
def test_gluon_forward_wide_consumer(shape, gluon_backend, monkeypatch):
    # WIDE: the two consumer warpgroups as one 8-warp partition (one code copy, 128-row wgmmas, one arrival a
    # release after the two warpgroups meet): both grids, causal calls on the schedule, against float64; packed
    # batches too
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    monkeypatch.setattr(fwd_sm90, "CONFIGS", {d: dict(c, WIDE=True, PINGPONG=False)
                                               for d, c in fwd_sm90.CONFIGS.items()})
    noncausal = {d: dict(c, CONSUMERS=2) for d, c in fwd_sm90.CONFIGS_NONCAUSAL.items()}  # d64's three: two
    monkeypatch.setattr(fwd_sm90, "CONFIGS_NONCAUSAL", noncausal)
    flashattn2.set_backend("gluon")
    plan = _forward_stress_and_packed(shape, 13)
    assert plan.attend.named["WIDE"] and plan.q_block[1] == 128


# CTAS_PER_SM=2's shapes: the d64 stress shapes and two causal ones with more items than programs
TWO_PER_SM_SHAPES = [s for s in STRESS if s[5] == 64] + [(2, 1000, 1000, 4, 2, 64, {"causal": True}),
                                                         (3, 512, 512, 8, 8, 64, {"causal": True})]


def _shape_id(shape) -> str:
    return "x".join(map(str, shape[:6])) + "-" + "-".join(shape[6])


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("shape", TWO_PER_SM_SHAPES, ids=_shape_id)
def test_gluon_forward_two_programs_per_sm(shape, gluon_backend, monkeypatch):
    # CTAS_PER_SM=2 (80 registers a thread, 64-key tiles): both grids (gluon_backend), causal calls on the
    # schedule over twice the SMs' programs, against float64; packed batches too
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    _two_programs_per_sm(monkeypatch, fp8=False)
    plan = _forward_stress_and_packed(shape, 7)
    assert plan.attend.named["CTAS_PER_SM"] == 2
    assert plan.attend.options["maxnreg"] == fwd_sm90.MAXNREG_TWO_PER_SM


def _two_programs_per_sm(monkeypatch, fp8: bool) -> None:
    """CTAS_PER_SM=2 for head dim 64 (bf16 or FP8), over what the gluon_backend fixture set; Gluon on."""
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    two = dict(CTAS_PER_SM=2, BLOCK_N=64, STAGES=2, Q_STAGES=1, SEPARATE_O=False, LAZY_O_WAIT=False, FREE_REGS=False,
               PERSISTENT_CAUSAL=True)
    base, tables = (("CONFIGS_FP8", ("CONFIGS_FP8_CAUSAL", "CONFIGS_FP8_DENSE")) if fp8 else
                    ("CONFIGS", ("CONFIGS_CAUSAL", "CONFIGS_NONCAUSAL")))
    monkeypatch.setattr(fwd_sm90, base, {**getattr(fwd_sm90, base), 64: dict(getattr(fwd_sm90, base)[64], **two)})
    for table in tables:  # their d64 entries change what the test sets
        monkeypatch.setattr(fwd_sm90, table, {k: v for k, v in getattr(fwd_sm90, table).items() if k != 64})
    flashattn2.set_backend("gluon")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("shape", TWO_PER_SM_SHAPES, ids=_shape_id)
def test_gluon_fp8_forward_two_programs_per_sm(shape, gluon_backend, monkeypatch):
    from flashattn2 import quantize_fp8

    _two_programs_per_sm(monkeypatch, fp8=True)
    q, k, v, options = _stress_case(*shape, dtype=torch.bfloat16, requires_grad=False)
    q8, k8, v8, *descales = quantize_fp8(q, k, v)
    out, lse, _ = flash_attn_func(q8, k8, v8, return_attn_probs=True, q_descale=descales[0], k_descale=descales[1],
                                  v_descale=descales[2], **options)
    plan = next(p for p in backends._plans.values() if hasattr(p, "attend"))
    assert plan.attend.named["CTAS_PER_SM"] == 2 and plan.attend.named["IS_FP8"]
    _fp8_check(q8, k8, v8, descales, out, lse, **options)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("config", ["default", "two"])
def test_gluon_fp8_forward_after_a_bf16_call(config, gluon_backend, monkeypatch):
    # the order that showed a bug: with CTAS_PER_SM=2 a bf16 call of the same one-row shape, then the FP8 call gave
    # an all-NaN output (lse right), 40 of 40 times alone; gone since seqlen_q is never folded into the forward
    # (benchmarks/NOTES.md, twelfth session)
    from flashattn2 import quantize_fp8

    if config == "two":
        _two_programs_per_sm(monkeypatch, fp8=False)
        _two_programs_per_sm(monkeypatch, fp8=True)
    q, k, v, options = _stress_case(1, 1, 1, 1, 1, 64, {}, dtype=torch.bfloat16, requires_grad=False)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    check_attention(q, k, v, out, lse, None, torch.empty_like(out))
    q8, k8, v8, *descales = quantize_fp8(q, k, v)
    out, lse, _ = flash_attn_func(q8, k8, v8, return_attn_probs=True, q_descale=descales[0], k_descale=descales[1],
                                  v_descale=descales[2])
    _fp8_check(q8, k8, v8, descales, out, lse)


def test_launch_register_cap_by_programs_per_sm():
    from flashattn2.kernels.sm90.forward import MAXNREG, MAXNREG_TWO_PER_SM, launch_maxnreg

    assert launch_maxnreg(2, 1) == MAXNREG[2] and launch_maxnreg(3, 1) == MAXNREG[3]
    # two programs of 384 threads each within an SM's 65536 registers, in steps of 8
    assert launch_maxnreg(2, 2) == MAXNREG_TWO_PER_SM == 80 and 2 * 384 * 80 <= 65536 < 2 * 384 * 88
    with pytest.raises(ValueError, match="CTAS_PER_SM=2 takes two consumers"):
        launch_maxnreg(3, 2)
    with pytest.raises(ValueError, match="FREE_REGS must be off"):
        launch_maxnreg(2, 2, free_regs=True)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_varlen_forward(causal, gluon_backend):
    lens_q, lens_k, cu_q, cu_k, q, k, v = _varlen_case(5)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                         return_attn_probs=True)
    check_varlen(q, k, v, out, lse, None, torch.empty_like(out), cu_q, cu_k, causal=causal)


def _fp8_check(q8, k8, v8, descales, out, lse, **options):
    from flashattn2.reference import attention_fp8_ref
    from helpers import FWD_FACTOR, assert_close_to_ref

    ref, ref_lse = attention_fp8_ref(q8, k8, v8, *descales, **options)
    pt, _ = attention_fp8_ref(q8, k8, v8, *descales, upcast=False, **options)
    assert out.dtype == torch.bfloat16
    assert_close_to_ref("out", out, ref, pt, FWD_FACTOR)
    # FP8 tensor cores do not sum the scores exactly in fp32: 3e-4 was seen on a row that sees one key
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)


def test_forward_never_folds_in_one_query_row():
    # Triton folds int arguments equal to 1 into the compile; ptxas dies on FP8 kernels with seqlen_q folded in
    from flashattn2.kernels.sm90.forward import attention_fwd_sm90_kernel

    unfolded = {p.name for p in attention_fwd_sm90_kernel.params if p.do_not_specialize}
    assert {"seqlen_q", "total_q", "total_k"} <= unfolded


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim,causal", [(64, False), (256, True)])
def test_gluon_fp8_one_query_row(head_dim, causal, gluon_backend):
    # fuzz seed 5, cases 23909 and 24244: ptxas crashed on these launches' specialisation
    from flashattn2 import quantize_fp8

    torch.manual_seed(0)
    q = torch.randn(2, 1, 4, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 727, 2, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q8, k8, v8, *descales = quantize_fp8(q, k, v)
    assert attention_backend(q8, k8, v8, causal=causal).forward == "gluon-sm90"
    out, lse, _ = flash_attn_func(q8, k8, v8, causal=causal, return_attn_probs=True, q_descale=descales[0],
                                  k_descale=descales[1], v_descale=descales[2])
    _fp8_check(q8, k8, v8, descales, out, lse, causal=causal)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("shape", STRESS, ids=lambda s: "x".join(map(str, s[:6])) + "-" + "-".join(s[6]))
def test_gluon_fp8_forward_stress(shape, gluon_backend):
    from flashattn2 import quantize_fp8

    q, k, v, options = _stress_case(*shape, dtype=torch.bfloat16, requires_grad=False)
    q8, k8, v8, *descales = quantize_fp8(q, k, v)
    assert attention_backend(q8, k8, v8, **options).forward == "gluon-sm90"
    out, lse, _ = flash_attn_func(q8, k8, v8, return_attn_probs=True, q_descale=descales[0], k_descale=descales[1],
                                  v_descale=descales[2], **options)
    _fp8_check(q8, k8, v8, descales, out, lse, **options)


def test_v_transpose_rule():
    # host-side: where the FP8 forward's in-kernel V transpose (V_TRANSPOSE) applies; off in every default tuning
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.kernels.sm90 import forward as fwd

    full, causal = AttnOptions(softmax_scale=1.0), AttnOptions(softmax_scale=1.0, window_right=0)
    assert not any(fwd.default_tuning(d, True, o)["V_TRANSPOSE"] for d in (64, 128, 256) for o in (full, causal))
    v = torch.empty(2, 1000, 2, 128, dtype=torch.float8_e4m3fn)
    tuning = dict(fwd.default_tuning(128, True, full), V_TRANSPOSE=True)
    # d128 non-causal's 256-key tiles and two stages take 224 KB already: no room for a 32 KB staging buffer
    assert fwd.fp8_smem_bytes(tuning, 128, False) == 224 * 1024
    assert "staging buffer does not fit" in fwd.v_transpose_declines(tuning, v)
    for head_dim, options, kb in ((64, full, 192), (64, causal, 192), (128, causal, 208), (256, full, 224),
                                  (256, causal, 224)):
        tuning = dict(fwd.default_tuning(head_dim, True, options), V_TRANSPOSE=True)
        assert fwd.fp8_smem_bytes(tuning, head_dim, True) == kb * 1024
        why = fwd.v_transpose_declines(tuning, v[..., :head_dim].contiguous() if head_dim <= 128 else
                                       torch.empty(2, 1000, 2, head_dim, dtype=torch.float8_e4m3fn))
        assert why is None or "TMA" in why, why  # these CPU tensors have no TMA; the rest of the rule passes
    two = dict(fwd.default_tuning(64, True, causal), CTAS_PER_SM=2, BLOCK_N=64, STAGES=2)
    assert "two programs per SM" in fwd.v_transpose_declines(two, v)
    assert "64-key chunks" in fwd.v_transpose_declines(dict(tuning, BLOCK_N=96), v[..., :128])
    assert "TMA" in fwd.v_transpose_declines(dict(fwd.default_tuning(128, True, causal), V_TRANSPOSE=True),
                                             v[0])  # packed
    # asked for by query rows (V_TRANSPOSE_ROWS: where it measured faster than the keys-last copy), or forced
    for head_dim, rows in ((64, 512), (128, 1024), (256, 1024)):
        for options in (full, causal):
            tuning = fwd.default_tuning(head_dim, True, options)
            assert fwd.v_transpose_asked(dict(tuning), rows) and not fwd.v_transpose_asked(dict(tuning), rows + 1)
            # rows per kv head: a GQA group of 4 from a quarter of the rows
            assert fwd.v_transpose_asked(dict(tuning), rows // 4, 4)
            assert not fwd.v_transpose_asked(dict(tuning), rows // 4 + 1, 4)
            popped = dict(tuning)
            fwd.v_transpose_asked(popped, 1)
            assert "V_TRANSPOSE_ROWS" not in popped  # a host key, not the kernel's
            assert fwd.v_transpose_asked(dict(tuning, V_TRANSPOSE=True), 1 << 20)
            assert not fwd.v_transpose_asked(dict(tuning, V_TRANSPOSE_ROWS=0), 1)
    assert not fwd.v_transpose_asked(dict(fwd.default_tuning(128, False, full)), 1)  # bf16: no such key


# V_TRANSPOSE's shapes: GQA, cut last tiles, one query row, a window, and a long causal call whose programs take
# several items each (V's staging barrier's phases run on across items)
V_TRANSPOSE_SHAPES = [
    (2, 300, 300, 4, 2, {}),
    (3, 65, 257, 4, 1, {"causal": True}),
    (1, 1000, 1000, 2, 2, {"causal": True}),
    (2, 513, 1031, 6, 3, {"window_size": (100, 30)}),
    (2, 1, 727, 4, 2, {}),
    (2, 4096, 4096, 8, 2, {"causal": True}),
]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("shape", V_TRANSPOSE_SHAPES, ids=lambda s: "x".join(map(str, s[:5])) + "-" + "-".join(s[5]))
def test_gluon_fp8_forward_v_transpose(shape, head_dim, gluon_backend, monkeypatch):
    # V transposed in the kernel (V_TRANSPOSE) against float64, both grids (gluon_backend); d128 non-causal's
    # default 256-key tiles leave no room for the staging buffer (v_transpose_declines), so it runs 128-key tiles
    from flashattn2 import quantize_fp8
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    configs = {d: dict(c, V_TRANSPOSE=True) for d, c in fwd_sm90.CONFIGS_FP8.items()}
    configs[128].update(BLOCK_N=128, STAGES=4)
    monkeypatch.setattr(fwd_sm90, "CONFIGS_FP8", configs)
    flashattn2.set_backend("gluon")
    q, k, v, options = _stress_case(*shape[:5], head_dim, shape[5], dtype=torch.bfloat16, requires_grad=False)
    q8, k8, v8, *descales = quantize_fp8(q, k, v)
    assert attention_backend(q8, k8, v8, **options).forward == "gluon-sm90"
    out, lse, _ = flash_attn_func(q8, k8, v8, return_attn_probs=True, q_descale=descales[0], k_descale=descales[1],
                                  v_descale=descales[2], **options)
    plan = next(p for p in backends._plans.values() if hasattr(p, "attend"))
    assert plan.attend.named["V_TRANSPOSE"] and plan.attend.named["IS_FP8"], plan.v_transpose_declined
    _fp8_check(q8, k8, v8, descales, out, lse, **options)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_v_transpose_falls_back_where_it_cannot_apply(causal, gluon_backend, monkeypatch):
    # asked for everywhere: d128 non-causal (no room for the staging buffer) keeps the keys-last copy and stays
    # right; packed FP8 batches stay on the Triton FP8 kernel (can_implement), whatever the tuning
    from flashattn2 import quantize_fp8
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    monkeypatch.setattr(fwd_sm90, "CONFIGS_FP8", {d: dict(c, V_TRANSPOSE=True)
                                                  for d, c in fwd_sm90.CONFIGS_FP8.items()})
    flashattn2.set_backend("gluon")
    q, k, v, options = _stress_case(2, 700, 700, 4, 2, 128, {"causal": causal}, dtype=torch.bfloat16,
                                    requires_grad=False)
    q8, k8, v8, *descales = quantize_fp8(q, k, v)
    out, lse, _ = flash_attn_func(q8, k8, v8, return_attn_probs=True, q_descale=descales[0], k_descale=descales[1],
                                  v_descale=descales[2], **options)
    plan = next(p for p in backends._plans.values() if hasattr(p, "attend"))
    # causal d128 takes 128-key tiles (CONFIGS_FP8_CAUSAL): there the staging buffer fits
    assert plan.attend.named["V_TRANSPOSE"] == causal, plan.v_transpose_declined
    assert causal or "staging buffer does not fit" in plan.v_transpose_declined
    _fp8_check(q8, k8, v8, descales, out, lse, **options)
    test_fp8_varlen_takes_the_triton_kernel(causal, None)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_varlen_takes_the_triton_kernel(causal, gluon_backend):
    from flashattn2 import quantize_fp8
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.reference import attention_fp8_ref
    from helpers import FWD_FACTOR, assert_close_to_ref

    lens_q, lens_k, cu_q, cu_k, q, k, v = _varlen_case(6)
    q8, k8, v8, *descales = quantize_fp8(q, k, v, cu_q, cu_k)
    opts = AttnOptions(softmax_scale=128**-0.5, window_right=0 if causal else -1, cu_seqlens_q=cu_q,
                       cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    assert backends.forward_backend(q8, k8, v8, opts) == ("triton", "packed (varlen) FP8 batches: the Triton FP8 "
                                                          "kernel runs them")
    out = flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                 q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
    for b in range(len(lens_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        if lens_k[b] == 0:
            assert (out[rows] == 0).all()
            continue
        args = (q8[None, rows], k8[None, keys], v8[None, keys], *(d[b:b + 1] for d in descales))
        ref, _ = attention_fp8_ref(*args, causal=causal)
        pt, _ = attention_fp8_ref(*args, causal=causal, upcast=False)
        assert_close_to_ref(f"out[{b}]", out[None, rows], ref, pt, FWD_FACTOR)


@pytest.mark.gpu
@hopper
def test_gluon_fp8_matches_the_triton_fp8_forward(gluon_backend):
    from flashattn2 import quantize_fp8

    torch.manual_seed(13)
    q, k, v = (randn(2, 2049, 8, 128, dtype=torch.bfloat16) for _ in range(3))
    q8, k8, v8, *descales = quantize_fp8(q, k[:, :, :2].contiguous(), v[:, :, :2].contiguous())
    kw = dict(causal=True, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
    first = flash_attn_func(q8, k8, v8, **kw)
    assert torch.equal(flash_attn_func(q8, k8, v8, **kw), first)  # bitwise repeatable
    flashattn2.set_backend("triton")
    assert attention_backend(q8, k8, v8, causal=True).forward == "triton"
    ref = flash_attn_func(q8, k8, v8, **kw)
    assert (first.float() - ref.float()).abs().max() < 3e-2


@pytest.mark.gpu
@hopper
def test_gluon_forward_100_calls_bitwise_equal_and_close_to_triton(gluon_backend):
    torch.manual_seed(9)
    q = randn(2, 1537, 8, 128, dtype=torch.bfloat16)
    k = randn(2, 2049, 2, 128, dtype=torch.bfloat16)
    v = randn(2, 2049, 2, 128, dtype=torch.bfloat16)
    first, first_lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    for _ in range(100):
        out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert torch.equal(out, first) and torch.equal(lse, first_lse)
    flashattn2.set_backend("triton")
    ref, ref_lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert (out.float() - ref.float()).abs().max() < 2e-2
    assert (lse - ref_lse).abs().max() < 1e-3


BWD_STRESS = [
    # batch, seqlen_q, seqlen_k, nheads, nheads_k, options
    (2, 128, 128, 2, 2, {}),
    (1, 1, 1, 1, 1, {}),
    (3, 65, 257, 4, 1, {"causal": True}),
    (2, 300, 77, 4, 2, {"causal": True}),
    (1, 1000, 1000, 2, 2, {"causal": True}),
    (2, 513, 1031, 6, 3, {"window_size": (100, 30)}),
    (2, 191, 383, 2, 2, {"softcap": 20.0}),
    (2, 250, 250, 4, 4, {"alibi": True, "causal": True}),
    (1, 4000, 129, 2, 2, {"causal": True, "window_size": (64, -1)}),
    # more work items than an H100 has SMs: each program of the persistent grid takes several
    (4, 300, 1500, 8, 4, {}),
]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-dq", "deterministic"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", BWD_STRESS, ids=lambda s: "x".join(map(str, s[:5])) + "-" + "-".join(s[5]))
def test_gluon_backward_stress(dtype, head_dim, shape, deterministic, gluon_backend):
    batch, seqlen_q, seqlen_k, nheads, nheads_k, options = shape
    q, k, v, options = _stress_case(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, options, dtype=dtype,
                                    requires_grad=True)
    assert attention_backend(q, k, v, **options).backward == "gluon-sm90"
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, deterministic=deterministic, **options)
    dout = randn(*out.shape, dtype=dtype)
    out.backward(dout)
    check_attention(q, k, v, out, lse, (q.grad, k.grad, v.grad), dout, **options)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_backward_free_regs(head_dim, causal, monkeypatch):
    # FREE_REGS: the backward compiled without `.maxnreg` (each consumer the 240 registers its setmaxnreg grants),
    # against float64, with cut query and key tiles and GQA
    from flashattn2.kernels.sm90 import backward as bwd_sm90

    monkeypatch.setattr(bwd_sm90, "CONFIGS", {**bwd_sm90.CONFIGS,
                                              head_dim: dict(bwd_sm90.CONFIGS[head_dim], FREE_REGS=True)})
    flashattn2.set_backend("gluon")  # drops plans made with the other tuning
    try:
        q, k, v, options = _stress_case(2, 333, 401, 4, 2, head_dim, {"causal": causal} if causal else {},
                                        dtype=torch.bfloat16, requires_grad=True)
        out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **options)
        dout = randn(*out.shape, dtype=torch.bfloat16)
        out.backward(dout)
        plan = next(p for p in backends._bwd_plans.values() if getattr(p, "gluon", None) is not None)
        assert plan.gluon.launch.named["FREE_REGS"] is True
        check_attention(q, k, v, out, lse, (q.grad, k.grad, v.grad), dout, **options)
    finally:
        flashattn2.set_backend(os.environ.get("FLASHATTN2_BACKEND", "auto"))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_varlen_backward(causal, head_dim, gluon_backend):
    lens_q, lens_k, cu_q, cu_k, q, k, v = _varlen_case(7, requires_grad=True, head_dim=head_dim)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                         return_attn_probs=True)
    dout = randn(*out.shape, dtype=torch.bfloat16)
    out.backward(dout)
    check_varlen(q, k, v, out, lse, (q.grad, k.grad, v.grad), dout, cu_q, cu_k, causal=causal)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gluon_varlen_backward_sequence_without_keys(head_dim, gluon_backend):
    # a packed sequence with query rows and no keys: its output and dQ are 0, and the sequences around it are
    # unaffected (no work item of that sequence has keys; dQ is still written)
    torch.manual_seed(3)
    lens_q, lens_k = [37, 5, 200], [50, 0, 130]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                  for lens in (lens_q, lens_k))
    q = randn(sum(lens_q), 4, head_dim, dtype=torch.bfloat16, requires_grad=True)
    k, v = (randn(sum(lens_k), 2, head_dim, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_attn_probs=True)
    dout = randn(*out.shape, dtype=torch.bfloat16)
    out.backward(dout)
    assert torch.count_nonzero(out[37:42]) == 0 and torch.count_nonzero(q.grad[37:42]) == 0
    keep_q = torch.cat([torch.arange(0, 37), torch.arange(42, 242)]).cuda()
    cu = torch.tensor([0, 37, 237], dtype=torch.int32, device="cuda")
    sub = [x.detach()[keep_q] for x in (q, out, dout, q.grad)]
    check_varlen(sub[0], k.detach(), v.detach(), sub[1], lse[:, keep_q], (sub[3], k.grad, v.grad), sub[2], cu,
                 cu_k[torch.tensor([0, 1, 3])])


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gluon_backward_grid_is_persistent_without_a_right_window_edge(head_dim, gluon_backend):
    # causal calls too where the tuning takes the scheduled grid (PERSISTENT_CAUSAL: d64, d128), with a schedule
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.kernels.portable import forward
    from flashattn2.kernels.sm90.backward import CONFIGS

    q, k, v, dout = (randn(4, 1500, 4, head_dim, dtype=torch.bfloat16) for _ in range(4))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for causal in (False, True):
        opts = AttnOptions(softmax_scale=0.1, window_right=0 if causal else -1)
        out, lse, _ = forward.attention_forward(q, k, v, opts)
        plan = backends.backward_plan(dout, q, k, v, out, lse, opts)
        work_items = plan.gluon.launch.named["num_tiles"]
        assert work_items > sms, "the shape should hold more work items than SMs"
        scheduled = causal and CONFIGS[head_dim].get("PERSISTENT_CAUSAL", False)
        assert plan.gluon.launch.grid[0] == (work_items if causal and not scheduled else sms)
        assert (plan.gluon.schedule is not None) == scheduled


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-dq", "deterministic"])
def test_gluon_backward_on_a_scheduled_causal_grid(head_dim, deterministic, monkeypatch):
    # PERSISTENT_CAUSAL: causal backward calls on a persistent grid, each program the items of its row of the
    # host-made schedule, more items than SMs; against float64, with cut tiles, GQA and a window; MLA's 192/128 too.
    # d128 and MLA with the table of places (PLACED_SCHEDULE), the others with the table of indexes
    from flashattn2.kernels.sm90 import backward as bwd_sm90

    placed = head_dim == 128
    _set_in_every_entry(monkeypatch, bwd_sm90, ("CONFIGS", "CONFIGS_DKDV", "CONFIGS_MLA"), PERSISTENT_CAUSAL=True,
                        PLACED_SCHEDULE=placed)
    flashattn2.set_backend("gluon")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [(3, 1100, 1300, 8, 2, head_dim, {"causal": True}), (2, 777, 777, 6, 6, head_dim, {"causal": True}),
             (2, 900, 900, 4, 2, head_dim, {"window_size": (200, 0)})]
    if head_dim == 128 and not deterministic:
        cases.append((2, 1000, 1000, 16, 16, 192, {"causal": True}))  # MLA (value head dim 128 below)
    for batch, seqlen_q, seqlen_k, nheads, nheads_k, dim, options in cases:
        torch.manual_seed(seqlen_q + dim)
        q = randn(batch, seqlen_q, nheads, dim, dtype=torch.bfloat16, requires_grad=True)
        k = randn(batch, seqlen_k, nheads_k, dim, dtype=torch.bfloat16, requires_grad=True)
        v = randn(batch, seqlen_k, nheads_k, 128 if dim == 192 else dim, dtype=torch.bfloat16, requires_grad=True)
        out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, deterministic=deterministic, **options)
        dout = randn(*out.shape, dtype=torch.bfloat16)
        out.backward(dout)
        plan = next(iter(backends._bwd_plans.values())).gluon
        assert plan.schedule is not None and plan.launch.grid[0] == min(sms, plan.launch.named["num_tiles"])
        assert plan.schedule.dtype == (torch.int64 if placed else torch.int32)
        check_attention(q, k, v, out, lse, (q.grad, k.grad, v.grad), dout, **options)
        flashattn2.set_backend("gluon")  # one plan at a time for the lookup above


def test_backward_schedule_costs_count_each_key_tiles_query_tiles():
    # host-side: the scheduled backward's cost of an item (a key tile) is the query tiles the kernel's loop visits
    # for it (q_range_for_kv_tile: every 64-row tile holding a row that sees one of its keys), per query head, plus
    # one for the item; and the schedule holds every item once
    import numpy as np

    from flashattn2.kernels.device.tile_order import decoded_schedule, schedule_items, sectioned_items
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.kernels.sm90.backward import causal_walk_costs

    block_m, block_n, num_bh = 64, 128, 6
    for seqlen_q, seqlen_k, window_left, section, group in ((300, 300, -1, 1, 1), (130, 400, -1, 3, 2),
                                                             (400, 257, 100, 2, 4), (129, 129, 0, 1, 1)):
        opts = AttnOptions(softmax_scale=1.0, window_left=window_left, window_right=0)
        num_blocks = -(-seqlen_k // block_n)
        costs = causal_walk_costs(num_blocks, num_bh, section, seqlen_q, seqlen_k, opts, block_m, block_n, group)
        rows, diag = np.arange(seqlen_q)[:, None], seqlen_k - seqlen_q
        for cost, block in zip(costs, sectioned_items(num_blocks, num_bh, section)[0], strict=True):
            keys = np.arange(block * block_n, min(block * block_n + block_n, seqlen_k))[None, :]
            sees = keys <= rows + diag
            if window_left >= 0:
                sees &= keys >= rows + diag - window_left
            tiles = np.unique(np.nonzero(sees.any(axis=1))[0] // block_m)
            assert cost == group * (tiles.max() - tiles.min() + 1 if len(tiles) else 0) + 1
        table = schedule_items(costs, 7)
        assert sorted(table[8:].tolist()) == list(range(len(costs)))
        # PLACED_SCHEDULE: each item as (key block, batch, kv head), counted from the first block
        heads = 3  # kv heads a batch entry
        placed = decoded_schedule(table, 7, num_blocks, num_bh, section, heads, reverse=False)[8:]
        block, b, h = ((placed >> 21 * i) & (1 << 21) - 1 for i in range(3))
        walk_block, walk_bh = sectioned_items(num_blocks, num_bh, section)
        assert np.array_equal(block, walk_block[table[8:]]) and np.array_equal(b * heads + h, walk_bh[table[8:]])


def test_backward_takes_the_scheduled_causal_grid_where_it_measured_faster():
    # host-side: PERSISTENT_CAUSAL by default where it was measured faster (fused dQ at head dims 64 and 128:
    # +1-7% causal 1k-8k, H200 2026-11-27); not at 256 or MLA (level there) or the dK/dV-only kernel
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.kernels.sm90.backward import tuning_for

    causal = AttnOptions(softmax_scale=1.0, window_right=0)
    deterministic = AttnOptions(softmax_scale=1.0, window_right=0, deterministic=True)
    assert [tuning_for(d, causal).get("PERSISTENT_CAUSAL", False) for d in (64, 128, 256)] == [True, True, False]
    assert not any(tuning_for(d, deterministic).get("PERSISTENT_CAUSAL", False) for d in (64, 128, 256))
    assert not tuning_for(192, causal, 128).get("PERSISTENT_CAUSAL", False)
    # MLA's 192/128: the scheduled grid over one L2 section for dense causal calls of at most 8k rows (-1 to -2%
    # time at 2k-8k, +1-4% at 16k, H200 2026-11-28); not packed, deterministic, non-causal or longer calls
    packed = AttnOptions(softmax_scale=1.0, window_right=0, cu_seqlens_q=torch.zeros(2, dtype=torch.int32),
                         cu_seqlens_k=torch.zeros(2, dtype=torch.int32), max_seqlen_q=2048, max_seqlen_k=2048)
    full = AttnOptions(softmax_scale=1.0)
    for rows, on in ((2048, True), (8192, True), (8193, False), (16384, False)):
        tuning = tuning_for(192, causal, 128, rows)
        assert tuning.get("PERSISTENT_CAUSAL", False) == on and tuning["L2_SECTIONS"] == (1 if on else 0), rows
        # with the table of places there (-0.9 to -1.2% time at 2k-8k, H200 2026-11-28); the other head dims keep
        # the table of indexes (1% slower with places)
        assert tuning.get("PLACED_SCHEDULE", False) == on, rows
    assert not any(tuning_for(d, causal).get("PLACED_SCHEDULE", False) for d in (64, 128, 256))
    for opts in (packed, deterministic, full):
        assert not tuning_for(192, opts, 128, 2048).get("PERSISTENT_CAUSAL", False)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("deterministic", [False, True], ids=["fused-dq", "deterministic"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_l2_sections_change_only_the_order(head_dim, deterministic, monkeypatch):
    # an L2 that fits 2 heads' backward streams (4 of the forward's): a causal grid over 5 heads walks sections
    # of 2 (4) heads, the last one short (device/tile_order.py); every item computes as in one head after another
    from flashattn2.kernels import common
    from flashattn2.kernels.sm90 import backward as bwd_sm90
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    seqlen = 1000
    monkeypatch.setattr(common, "_l2_bytes", lambda index: 2 * seqlen * head_dim * 8 + 1)
    torch.manual_seed(3)
    q, k, v = (randn(1, seqlen, 5, head_dim, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = randn(1, seqlen, 5, head_dim, dtype=torch.bfloat16)
    results, sections = {}, {}
    for on in (False, True):
        for module, name in ((fwd_sm90, "CONFIGS"), (bwd_sm90, "CONFIGS"), (bwd_sm90, "CONFIGS_DKDV")):
            configs = getattr(module, name)
            monkeypatch.setattr(module, name, {d: dict(c, L2_SECTIONS=on) for d, c in configs.items()})
        flashattn2.set_backend("gluon")  # drops the plans made with the other order
        out = flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
        results[on] = (out, *torch.autograd.grad(out, (q, k, v), dout))
        fwd_plan = next(p for p in backends._plans.values() if hasattr(p, "attend"))
        bwd_plan = next(iter(backends._bwd_plans.values()))
        sections[on] = (fwd_plan.attend.named["section"], bwd_plan.gluon.launch.named["section"])
    flashattn2.set_backend(backends._checked(os.environ.get("FLASHATTN2_BACKEND", "auto")))
    assert sections == {False: (1, 1), True: (4, 2)}
    for name, off, on in zip(("out", "dq", "dk", "dv"), results[False], results[True], strict=True):
        if name == "dq" and not deterministic:  # reduce-adds land in any order
            torch.testing.assert_close(on, off, atol=2e-2, rtol=2e-2)
        else:
            assert torch.equal(on, off), name


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim", [128, 256])
def test_l2_sections_change_only_the_order_fp8(head_dim, monkeypatch):
    # the FP8 forward in sections of 2 heads over 5 (the last section short): outputs equal bit for bit
    from flashattn2 import quantize_fp8
    from flashattn2.kernels import common
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    seqlen = 3000
    monkeypatch.setattr(common, "_l2_bytes", lambda index: 2 * seqlen * head_dim * 2 + 1)
    torch.manual_seed(4)
    q8, k8, v8, qd, kd, vd = quantize_fp8(*(randn(1, seqlen, 5, head_dim, dtype=torch.bfloat16) for _ in range(3)))
    outs, sections = {}, {}
    for on in (0, 1):
        monkeypatch.setattr(fwd_sm90, "CONFIGS_FP8", {d: dict(c, L2_SECTIONS=on) for d, c in
                                                      fwd_sm90.CONFIGS_FP8.items()})
        flashattn2.set_backend("gluon")
        outs[on] = flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
        sections[on] = next(p for p in backends._plans.values() if hasattr(p, "attend")).attend.named["section"]
    flashattn2.set_backend(backends._checked(os.environ.get("FLASHATTN2_BACKEND", "auto")))
    assert sections == {0: 1, 1: 2}
    assert torch.equal(outs[0], outs[1])


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("programs", [7, 64])
@pytest.mark.parametrize("case", ["d64", "d128", "d256", "d128-window", "d128-fp8"])
def test_persistent_causal_walk_changes_only_the_order(case, programs, monkeypatch):
    # PERSISTENT_CAUSAL: a few programs take the items of the schedule table (7 programs: several items each,
    # unequal counts); every item computes as on the one-program-per-item grid, bit for bit
    from flashattn2 import quantize_fp8
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    head_dim = int(case.split("-")[0][1:])
    torch.manual_seed(5)
    q, k, v = (randn(2, 1000, 5, head_dim, dtype=torch.bfloat16) for _ in range(3))
    kwargs = dict(causal=True)
    if case.endswith("fp8"):
        q, k, v, qd, kd, vd = quantize_fp8(q, k, v)
        kwargs.update(q_descale=qd, k_descale=kd, v_descale=vd)
    if case.endswith("window"):
        kwargs.update(window_size=(300, 0))
        k, v = (torch.cat([x, x[:, :200]], 1) for x in (k, v))  # more keys than queries
    real = torch.cuda.get_device_properties

    class Props:  # the GPU's own, but for the number of SMs the persistent grid takes
        multi_processor_count = programs

        def __init__(self, device):
            self.real = real(device)

        def __getattr__(self, name):
            return getattr(self.real, name)

    monkeypatch.setattr(torch.cuda, "get_device_properties", Props)
    results, named = {}, {}
    for on in (False, True):
        for name in ("CONFIGS", "CONFIGS_FP8", "CONFIGS_CAUSAL", "CONFIGS_FP8_CAUSAL"):
            configs = getattr(fwd_sm90, name)
            monkeypatch.setattr(fwd_sm90, name, {d: dict(c, PERSISTENT_CAUSAL=on) for d, c in configs.items()})
        flashattn2.set_backend("gluon")  # drops the plans made with the other walk
        results[on] = flash_attn_func(q, k, v, return_attn_probs=True, **kwargs)[:2]
        plan = next(p for p in backends._plans.values() if hasattr(p, "attend"))
        named[on] = (plan.attend.grid[0], plan.schedule is not None)
    flashattn2.set_backend(backends._checked(os.environ.get("FLASHATTN2_BACKEND", "auto")))
    assert named[True] == (programs, True) and named[False][1] is False and named[False][0] > programs
    for off, on in zip(results[False], results[True], strict=True):
        assert torch.equal(on, off)


@pytest.mark.gpu
@hopper
def test_causal_plan_first_made_in_a_capture_keeps_one_program_per_item(monkeypatch):
    # the schedule table's copy to the GPU cannot be captured: a dense causal forward whose plan is first made
    # inside a CUDA-graph capture runs one program per item, and replays as eager (docs/checks.md)
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    torch.manual_seed(6)
    q, k, v = (randn(2, 2000, 10, 128, dtype=torch.bfloat16) for _ in range(3))  # 320 items of 128 rows
    flashattn2.set_backend("gluon")
    scheduled = flash_attn_func(q, k, v, causal=True)  # compiles the scheduled variant
    configs = fwd_sm90.CONFIGS_CAUSAL
    monkeypatch.setattr(fwd_sm90, "CONFIGS_CAUSAL", {d: dict(c, PERSISTENT_CAUSAL=False) for d, c in configs.items()})
    flashattn2.set_backend("gluon")
    eager = flash_attn_func(q, k, v, causal=True)  # compiles the one-program-per-item variant, off the capture
    monkeypatch.setattr(fwd_sm90, "CONFIGS_CAUSAL", configs)
    flashattn2.set_backend("gluon")  # drops the plans: the next one is made inside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flash_attn_func(q, k, v, causal=True)
    graph.replay()
    plan = next(p for p in backends._plans.values() if hasattr(p, "attend"))
    flashattn2.set_backend(backends._checked(os.environ.get("FLASHATTN2_BACKEND", "auto")))
    assert plan.schedule is None and plan.attend.grid[0] == 320
    assert torch.equal(captured, eager) and torch.equal(scheduled, eager)


@pytest.mark.gpu
@hopper
def test_gluon_backward_fuses_dq_unless_deterministic(gluon_backend):
    from flashattn2.kernels.params import AttnOptions
    from flashattn2.kernels.portable import forward

    q, k, v, dout = (randn(1, 256, 2, 128, dtype=torch.bfloat16) for _ in range(4))
    for deterministic in (False, True):
        opts = AttnOptions(softmax_scale=0.1, window_right=0, deterministic=deterministic)
        out, lse, _ = forward.attention_forward(q, k, v, opts)
        plan = backends.backward_plan(dout, q, k, v, out, lse, opts)
        assert plan.gluon is not None and plan.fused_dq == (not deterministic)
        assert (plan.dq is None) == (not deterministic)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim", [128, 256])
def test_gluon_backward_100_calls_bitwise_equal(head_dim, gluon_backend):
    from helpers import assert_bitwise_repeatable

    torch.manual_seed(11)
    q = randn(2, 1537, 8, head_dim, dtype=torch.bfloat16, requires_grad=True)
    k = randn(2, 1537, 2, head_dim, dtype=torch.bfloat16, requires_grad=True)
    v = randn(2, 1537, 2, head_dim, dtype=torch.bfloat16, requires_grad=True)
    dout = randn(2, 1537, 8, head_dim, dtype=torch.bfloat16)
    # deterministic=True: dQ from the dQ kernel (the fused kernel's reduce-adds land in any order)
    assert_bitwise_repeatable(lambda q, k, v: flash_attn_func(q, k, v, causal=True, deterministic=True), q, k, v,
                              dout, times=100)


def test_without_gluon_every_call_takes_triton(monkeypatch):
    q = randn(1, 64, 2, 128, dtype=torch.bfloat16)
    monkeypatch.setattr(backends, "GLUON_AVAILABLE", False)
    assert attention_backend(q, q, q) == ("triton", "triton", "forward: this Triton has no Gluon; "
                                          "backward: this Triton has no Gluon")


def test_set_backend_drops_remembered_calls():
    from flashattn2 import interface

    q = randn(1, 8, 1, 16, dtype=torch.float16)
    flash_attn_func(q, q, q)
    assert len(interface._seen) > 0
    try:
        flashattn2.set_backend("triton")
        assert len(interface._seen) == 0
    finally:
        flashattn2.set_backend(os.environ.get("FLASHATTN2_BACKEND", "auto"))


def test_descriptors_view_packed_batches_as_one_batch_entry():
    from flashattn2.kernels.sm90.common import descriptor
    from flashattn2.kernels.sm90.gluon_api import shared_layout

    layout = shared_layout([1, 64, 1, 64], torch.float16)
    dense = torch.empty(2, 100, 3, 64, dtype=torch.float16)
    d = descriptor(dense, [1, 64, 1, 64], layout).descriptor()
    assert (list(d.shape), list(d.strides)) == ([2, 100, 3, 64], list(dense.stride()))
    packed = torch.empty(150, 3, 64, dtype=torch.float16)
    p = descriptor(packed, [1, 64, 1, 64], layout).descriptor()
    assert list(p.shape) == [1, 150, 3, 64] and list(p.strides)[1:] == list(packed.stride())


def test_the_backend_is_chosen_once_per_shape_and_option_set(monkeypatch):
    from flashattn2.kernels.params import AttnOptions

    q = randn(1, 8, 1, 16, dtype=torch.float16)
    options = AttnOptions(softmax_scale=0.25)
    first = backends.forward_plan(q, q, q, options)
    calls = []
    monkeypatch.setattr(backends, "forward_backend", lambda *a, **kw: calls.append(1) or ("triton", "spy"))
    assert backends.forward_plan(q, q, q, options) is first and not calls
    flashattn2.set_backend(backends.get_backend())  # drops the plans: the next call chooses again
    backends.forward_plan(q, q, q, options)
    assert calls == [1]


@pytest.mark.gpu
@hopper
def test_gluon_launches_keep_their_encoded_descriptors():
    # Triton 3.6's launcher encodes every TMA descriptor on each call; a Launch keeps them by address and shape
    # (launch._Encoded). Each call must equal Triton's own path, and a new address must get its own descriptor.
    import triton

    from flashattn2.kernels.sm90.forward import Sm90ForwardPlan

    def call(q, k, v):
        return flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[:2]

    flashattn2.set_backend("gluon")
    try:
        torch.manual_seed(31)
        q, k, v = (randn(2, 333, 4, 128, dtype=torch.bfloat16) for _ in range(3))
        first = call(q, k, v)  # through Triton: compiles, fixes the Launch
        plan = next(p for p in backends._plans.values() if isinstance(p, Sm90ForwardPlan))
        encoded = plan.attend._encoded
        assert encoded is not None or not triton.__version__.startswith("3.6.")
        assert all(map(torch.equal, call(q, k, v), first))
        q2, k2, v2 = (randn(2, 333, 4, 128, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        out, lse = call(q2, k2, v2)
        dout = randn(*out.shape, dtype=torch.bfloat16)
        out.backward(dout)
        check_attention(q2, k2, v2, out, lse, (q2.grad, k2.grad, v2.grad), dout, causal=True)
        if encoded is not None:
            assert [len(kept) for _, _, kept in encoded.slots][:3] == [2, 2, 2]  # q, k, v: two addresses each
            plan.attend._encoded = None  # Triton's launcher encodes them again: the same output, bit for bit
            again = call(q2.detach(), k2.detach(), v2.detach())
            assert torch.equal(again[0], out.detach()) and torch.equal(again[1], lse)
    finally:
        flashattn2.set_backend(os.environ.get("FLASHATTN2_BACKEND", "auto"))
