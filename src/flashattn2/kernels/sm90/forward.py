"""Hopper (sm_90) forward in Gluon, in FlashAttention-3's structure.

One program per 128-row query tile of one (batch, head), in three warp partitions:
- a producer (the default partition) loads the two 64-row Q halves once, then streams K and V tiles
  with TMA into a ring of STAGES shared-memory stages; k_ready / v_ready (expect-tx) say a stage is
  full, kv_empty (count 2, one arrival per consumer) that both consumers are done with it: K's at
  stage s, released when S retires, V's at STAGES + s, released when PV retires, so that K of the
  next tile but one can load while the PV of the last still reads V;
- two consumer warpgroups, one per 64-row half: S = Q Kᵀ by wgmma from shared memory, the online
  softmax in registers, P kept in registers as the A operand of O += P V. Each step issues S_j and
  PV_{j-1} back to back and waits for S_j alone, so the softmax of tile j runs under the PV matmul
  of tile j-1 (FlashAttention-3's intra-warpgroup overlap).
O goes out through TMA from the consumer's (no longer needed) Q stage; packed variable-length
batches store with masked pointer stores, since a descriptor cannot end at each sequence.

IS_FP8 (FlashAttention-3's FP8 path): q, k, v in e4m3 with (batch, kv head) descales folded into the
score scale and the output; P goes to the PV matmul in e4m3, scaled by 2**8, through shared memory.
FP8 tensor cores read both operands K-major, so each call first copies V keys-last (portable/v_layout.py), keys
relabelled within each 64 so that P's stores are 16 bytes wide, and loads it as (head_dim, keys) tiles;
O (bf16) leaves with pointer stores. V_TRANSPOSE (an FP8 tuning key; calls of few query rows, V_TRANSPOSE_ROWS)
drops that copy: the producer
TMA-loads V as (keys, head_dim) tiles into a staging buffer and its four warps write each, transposed and with the
same relabelling, into the K-major V stage the PV wgmma reads (_transpose_v; v_transpose_declines says when not).

Masks, score transforms, block ranges and sequence bounds are the portable kernels' @triton.jit
helpers (they compile inside Gluon), so both backends share one definition of every option.
"""

import numpy as np
import torch

from .. import common
from ..common import cdiv, l2_section
from ..device.block_range import kv_range_for_q_tile
from ..device.scores import alibi_slope_of, fp8_scales, score_tail
from ..device.seqlen_info import ROW_COUNTS
from ..device.softmax import finalize, online_softmax_update
from ..device.tile_order import MAX_SCHEDULED_ITEMS, decoded_schedule, schedule_items, sectioned_items
from ..device.tma import tma_batch
from ..launch import Launch
from ..params import AttnOptions, lse_strides, problem_dims, row_strides
from ..portable.v_layout import RELABEL_KEYS, v_keys_last
from ..tma import tma_usable
from .common import (
    _SCALAR,
    WG_M,
    BlockLists,
    ScoreMod,
    WorkGrid,
    _value,
    compile_gluon,
    descriptor,
    free_phase,
    free_registers,
    mod_signature,
    p_layout,
    ready_phase,
    sm90_declines,
    to_half2,
    wgmma_layout,
)
from .gluon_api import (
    aggregate,
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    shared_layout,
    thread_barrier,
    tma_load,
    tma_store,
    tma_store_wait,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# head dim -> tuning: key-tile rows, K/V ring stages (the stages and the Q tile must fit 227 KB of shared
# memory), ping-pong of the two consumers, a persistent grid (PERSISTENT: items i, i + grid, ... for calls without
# a right window edge; causal items differ in cost, see PERSISTENT_CAUSAL).
# L2_SECTIONS (grids of one program per item, causal): items walk query tile by query tile, longest first, over
# sections of heads whose K and V fit in 1/L2_SECTIONS of L2 (device/tile_order.py); 0: one head after another.
# Causal bf16 512-8k: d128 (a quarter) -1% to +5%, d256 (half) -1% to +8%; FP8 2k-16k: d128 (a quarter) +3% to
# +6%, d256 -2% to +3% (kept off) (2026-11-24); d64 (a quarter) within 2% (kept off).
# PERSISTENT_CAUSAL: a persistent grid for dense calls with a right window edge too, each program taking the items
# a host-made schedule gives it (grid_choice's "scheduled" walk). A static stride over the sectioned walk lost
# 25-30% from 1k tokens, every head longest first in snake rounds 8-26% at 512-4k; the schedule gained (H100,
# 2026-11-24, NOTES.md): the CONFIGS_CAUSAL entries below.
# SEPARATE_O: O staged in its own buffer (32 KB at d128: 2 stages there), so that the consumers free Q when their
# last S retired and the producer loads the next item's Q under this one's epilogue (with the schedule, d128 bf16:
# +2% to +5% over PERSISTENT_CAUSAL alone). ITEM_COST: what the schedule counts for an item's prologue and
# epilogue, in key tiles (0, 2 and 4 within 1% of 1 at d128/d256 512-2k, H100 2026-11-24).
# Q_STAGES: Q parts for this many work items, so that the producer loads the next item's Q while this one runs
# (with one, ncu showed the consumers waiting for Q at each item's start and the producer for a free Q part: 8% and
# 11% of their samples at d128 512 tokens). LAZY_O_WAIT (with SEPARATE_O): an item's O store is waited for only
# when its buffer is written again.
# Measured choices: benchmarks/NOTES.md.
# CONSUMERS: MMA warpgroups of 64 query rows each (a work item's rows: 64 x CONSUMERS). 3 is FlashAttention-3's d64
# tile (192 rows); without ping-pong or FP8, and with less registers each (CONSUMER_REGS): d64 non-causal from 2k
# (CONFIGS_NONCAUSAL); causal lost 15-40% at 512-4k (it spills on the schedule's path).
# the keys every entry shares: a persistent grid where items cost alike, the options above off, two consumers
# FREE_REGS: compile under common.free_registers (no `.maxnreg`: each partition as many registers as its setmaxnreg
# grants; the three-consumer d64 kernel stops spilling). On where it measured faster (CONFIGS_NONCAUSAL's d64); at
# d128, d256 and d64 causal it was within noise (-3 to +4%, H100, 2026-11-25), so off there
# CTAS_PER_SM: programs resident per SM (2: the launch's register cap and the consumers' share halved, the persistent
# grid twice the SMs), so that one program's item prologue and epilogue overlap another's tiles where items hold few
# key tiles (short causal calls); the shared memory must allow it (CONSUMERS=2 only)
# FIRST_FULL (off where left out; on in CONFIGS_CAUSAL's d64): an item's first key tile skips the mask where every
# row sees it whole (causal items past the first block, non-causal ones whose keys fill the tile), through a uniform
# branch between two compiled versions (sm_90: d128 causal 4,952 -> 5,928 instructions, ~250 fewer run per such
# tile and warp)
# IDLE_SKIP (off where left out): a consumer whose 64 rows all lie past the sequence's end walks the key tiles'
# barriers without its matmuls (three consumers' 192-row items waste 1/9 of the work at 512 rows, 1/18 at 1k).
# Measured (H200, 2026-11-28, results/2026-11-28_s27_ab/02): d64 non-causal 512 -10%, 1k / 2k level, 900 rows level
# WIDE (off where left out): the two consumer warpgroups as one 8-warp partition running one code copy
# (128-row wgmmas; the two warpgroups meet at a named barrier before each release, whose one arrival would otherwise
# speak for the arriving warpgroup only). ncu at 512: d64 causal's warps waited on instruction fetch in 24% of the
# samples (d128: 7%); sm_90 d64 causal 4,456 -> 2,416 instructions. No ping-pong, FP8 or MLA with it. Measured
# (H200, 2026-11-28, results/2026-11-28_s26_ab/02-03): d64 causal 512 +13% over the default (still 6% under the
# Triton forward), 1k-8k -12 to -15%; d128 and d256 -13 to -23%; d64 non-causal -24 / -29%
_GRID = dict(PERSISTENT=True, PERSISTENT_CAUSAL=False, SEPARATE_O=False, CONSUMERS=2, ITEM_COST=1, Q_STAGES=1,
             LAZY_O_WAIT=False, FREE_REGS=False, CTAS_PER_SM=1)
# V_TRANSPOSE (FP8): V transposed in the kernel from a one-tile staging buffer instead of the keys-last copy before
# each call (portable/v_layout.py, ~20 us at 16k tokens x 2048). Where it cannot apply (v_transpose_declines: shared
# memory, registers, V's strides) the call keeps the copy. V_TRANSPOSE_ROWS (a host key): calls with at most this
# many query rows per kv head take it, where the copy's cost outweighs the transpose's share of each tile. Against the
# copy, in both orders (2026-11-28; the second default run): H100 512 rows d64 +11 / +7% (non-causal / causal),
# d128 causal +38%, d256 +49 / +21%; 1k d64 -2 / +1%, d128 causal +10%, d256 +5 / +6%; 2k d64 -5 / -3%, d128 causal
# +1%, d256 -3%. H200: 512 +4 to +14%, 1k d64 -3%, d128 / d256 +1 to +5%, from 2k 0.88-0.98x. (d128 non-causal's
# 256-key tiles leave no room.)
_FP8 = dict(_GRID, V_TRANSPOSE=False, V_TRANSPOSE_ROWS=0)
# the tuning keys the host reads (launch grid, schedule): not kernel arguments. FREE_REGS is read by the host too,
# and passed as an argument the kernel ignores, so that Triton caches the two compiles apart (triton 3.6 keys its
# cache on the arguments, not on the stage hook)
HOST_TUNING_KEYS = ("PERSISTENT", "PERSISTENT_CAUSAL", "L2_SECTIONS", "ITEM_COST", "V_TRANSPOSE_ROWS",
                    "FIRST_FULL_MIN_ROWS")
CONFIGS = {
    64: dict(BLOCK_N=128, STAGES=4, PINGPONG=False, L2_SECTIONS=0, **_GRID),
    128: dict(BLOCK_N=128, STAGES=3, PINGPONG=True, L2_SECTIONS=4, **_GRID),
    256: dict(BLOCK_N=64, STAGES=2, PINGPONG=True, L2_SECTIONS=2, **_GRID),
}
# FP8: K and V tiles take half the bytes, so longer key tiles fit: fewer per-tile steps per key (H100 A/B:
# benchmarks/NOTES.md). Causal (any right window edge) d128 keeps 128-key tiles: its work items hold few.
CONFIGS_FP8 = {
    64: dict(BLOCK_N=256, STAGES=3, PINGPONG=False, L2_SECTIONS=0, **dict(_FP8, V_TRANSPOSE_ROWS=512)),
    128: dict(BLOCK_N=256, STAGES=2, PINGPONG=True, L2_SECTIONS=4, **dict(_FP8, V_TRANSPOSE_ROWS=1024)),
    256: dict(BLOCK_N=128, STAGES=2, PINGPONG=False, L2_SECTIONS=0, **dict(_FP8, V_TRANSPOSE_ROWS=1024)),
}
# dense calls with a right window edge (causal), over CONFIGS' entry: the scheduled persistent grid. Against one
# program per item, d128 causal (SEPARATE_O, 2 stages) 512 / 1k / 2k / 4k / 16k +27 / +19 / +11 / +5 / +3%; d64
# (SEPARATE_O) +3 / +2 / +14 / +6 / +4%; d256 +5 / +6 / +4 / +1 / +3% (bf16, H100, 2026-11-24)
# Then two Q stages with the lazy O wait (Q_STAGES, LAZY_O_WAIT): d128 +4 / +4 / +3 / +1 / -1%, d64 -2 / +5 / +4 /
# +1 / +3% (2026-11-25)
# Then FIRST_FULL at d64 (H200, 2026-11-28, results/2026-11-28_s26_ab/02 and 04, TFLOP/s over the default): 1k +1.4
# / +0.5 / +1.3%, 2k +2.3 / +1.1 / +3.6%, 4k +3.2%, 8k +1.8%; at 512 0.89 / 0.90 / 0.90, so from FIRST_FULL_MIN_ROWS
# query rows (a host key) only; d128 -1.2 / +0.8 / +0.3% at 512 / 1k / 4k and d256 +0.7 / +0.8 / -4.1%, so not there
CONFIGS_CAUSAL = {
    64: dict(PERSISTENT_CAUSAL=True, SEPARATE_O=True, Q_STAGES=2, LAZY_O_WAIT=True, FIRST_FULL=True,
             FIRST_FULL_MIN_ROWS=1024),
    128: dict(PERSISTENT_CAUSAL=True, SEPARATE_O=True, STAGES=2, Q_STAGES=2, LAZY_O_WAIT=True),
    256: dict(PERSISTENT_CAUSAL=True),
}
# dense calls without a right window edge, over CONFIGS' entry: d64 takes three consumers (192-row items) against two,
# 512 / 1k / 2k / 4k / 16k -1 / -1 / +8 / +7 / +9%; d128 O apart with 2 stages +2 / +1 / +2 / +1 / 0% (8k +1%)
# (bf16, H100, 2026-11-24; three consumers with O apart lost 7% at 16k). Then two Q stages: d128 +13 / +7 / +4 / -1 /
# +1%, d64 2k / 4k / 16k +3 / 0 / 0% (2026-11-25; the lazy O wait with them lost 7% at d128 16k). Then FREE_REGS at
# d64 (its consumers' 160 registers, no stack): +6 / +4 / +6 / +4 / +3%, in two runs (bf16, H100, 2026-11-25)
CONFIGS_NONCAUSAL = {
    64: dict(CONSUMERS=3, Q_STAGES=2, FREE_REGS=True),
    128: dict(SEPARATE_O=True, STAGES=2, Q_STAGES=2),
}
# FP8 causal: d128 keeps 128-key tiles (its work items hold few); the scheduled grid at d64 +42 / +40 / +27 / +19 /
# +3% and d128 +17 / +20 / +11 / +6 / +2% (512-16k); at d256 it lost 7-12% at 1k-2k, so d256 keeps one program
# per item
CONFIGS_FP8_CAUSAL = {
    64: dict(PERSISTENT_CAUSAL=True),
    128: dict(BLOCK_N=128, STAGES=4, PINGPONG=True, PERSISTENT_CAUSAL=True),
}
# FP8 dense calls, causal or not, over the entries above: two Q stages, non-causal d64 512 / 1k / 2k / 4k / 16k +3 /
# +5 / +2 / +1 / -2%, causal +3 / +7 / +10 / +6 / 0%; d128 non-causal +13 / +12 / +7 / +3 / +1%, causal +2 / +3 /
# +2 / +2 / +4% (H100, 2026-11-25)
CONFIGS_FP8_DENSE = {64: dict(Q_STAGES=2), 128: dict(Q_STAGES=2)}
# a value head dim unlike the query's (MLA), by (query/key head dim, value head dim): Q and K in 64-column tiles
# (QK_CHUNKS of them), O through pointer stores, Q released as soon as its last S is out (SEPARATE_O). Shared
# memory at 192/128 with 128-key tiles, 2 stages: Q 48 KB, K 96 KB, V 64 KB
MLA_CHUNK = 64
CONFIGS_MLA = {
    (192, 128): dict(BLOCK_N=128, STAGES=2, PINGPONG=True, L2_SECTIONS=2, **dict(_GRID, SEPARATE_O=True)),
}
CONFIGS_MLA_CAUSAL = {(192, 128): dict(PERSISTENT_CAUSAL=True)}
# where "auto" takes this kernel: at head dim 64 the Triton forward is as fast (NOTES.md), except dense calls
# without a right window edge from AUTO_D64_MIN_ROWS query rows, where three consumers beat it (bf16, H100,
# 2026-11-25, with FREE_REGS, TFLOP/s against Triton's: 512 350 / 334, 1k 395-402 / 371, 2k 460 / 396, 4k 465 /
# 409, 16k 490 / 431; shorter calls not measured), and dense causal calls from AUTO_D64_CAUSAL_MIN_ROWS (2026-11-25,
# two Q stages: 8k 418 against 410, 16k 454 against 430; 4k level). With P packed by cvt.rn.bf16x2 (2026-11-28,
# H200, one process): 1k 285 against 312, 2k 371 / 368 and 364 / 350 (two runs), 4k 406 / 388, 8k 431 / 418. With
# FIRST_FULL from 1k rows (2026-11-28, H200, two runs of five rounds, results/2026-11-28_s27_ab/08): 1k 313 / 314
# against 311 / 304, 1.5k 356 / 354 against 341 / 337; 768 rows 241 against 279 (Triton stays below 1k)
AUTO_HEAD_DIMS = (128, 256)
# MLA's 192/128 (CONFIGS_MLA): 1.04 / 1.10 / 1.11 / 1.30x cuDNN causal at 2k / 4k / 8k / 16k, where the Triton forward
# ran 0.57-0.72x (bf16, H100, 2026-11-25)
AUTO_MLA_QUERY_DIMS = (192,)
AUTO_HEAD_DIMS_FP8 = (64, 128, 256)
AUTO_D64_MIN_ROWS = 512
AUTO_D64_CAUSAL_MIN_ROWS = 1024
# FP8 causal calls with fewer query rows than this (per head dim) ran faster on the Triton FP8 kernel: their
# work items hold few key tiles, so this kernel's pipeline fill and drain show (H100, NOTES.md). With the scheduled
# grid (2026-11-24) d64 overtook it from 4k (410 against 384); with two Q stages (2026-11-25) d64 at 2k is level
# (318 against 314), d128 at 1k ahead (350 against 339), at 512 not (206 against 216). With V_TRANSPOSE (2026-11-28,
# Gluon / Triton, two runs each): d64 512 / 1k / 2k 0.96 / 0.94 / 1.00 (H100), 0.92 / 0.93 / 1.02 (H200), 4k 1.13 and
# 1.15; d128 1.10-1.23 from 256 rows (H100), 1.11-1.13 at 512-1k (H200). d64 at 256 read 1.11 (H100): not kept here.
# Against the Triton FP8 kernel's 64-row tiles as one loop (2026-11-29, H200, ms Triton / Gluon): d64 2k 0.341 /
# 0.470, 4k 0.589 / 0.722, 8k 1.093 / 1.186; d128 512 0.115 / 0.121, 1k 0.161 / 0.162, 2k 0.255 / 0.240; d256 512
# 0.116 / 0.123, 1k 0.160 / 0.157
# FP8 non-causal, against the Triton FP8 kernel's 64-row tiles (2026-11-29, H200, five alternating rounds, ms Triton /
# Gluon, results/2026-11-29_s29_ab/01-03): d64 512 0.189 / 0.213, 1k 0.306 / 0.376, 2k 0.552 / 0.616, 4k 1.033 /
# 1.081, 8k 2.016 / 2.031 and 2.001 / 2.054, 16k 3.953 / 3.953; d128 512 level in the FP8 bench (456 / 458 TFLOP/s),
# 1k 0.238 / 0.222; d256 512 0.142 / 0.137, 1k 0.213 / 0.200
# by mask, then head dim: dense FP8 calls with fewer query rows than this run the Triton FP8 kernel (other windows
# were not measured: Gluon)
AUTO_FP8_MIN_ROWS = {"causal": {64: 16384, 128: 1024, 256: 1024}, "non-causal": {64: 16384, 128: 0, 256: 0}}


def auto_declines(q: torch.Tensor, opts: AttnOptions) -> str | None:
    """Why "auto" keeps a call this kernel can run on the Triton forward (measured as fast or faster)."""
    fp8 = q.dtype == torch.float8_e4m3fn
    d64_long = q.shape[-1] == 64 and not fp8 and q.dim() == 4 and (
        (opts.window_right < 0 and q.shape[1] >= AUTO_D64_MIN_ROWS)
        or (opts.causal and q.shape[1] >= AUTO_D64_CAUSAL_MIN_ROWS))
    # a query head dim of CONFIGS_MLA reaches here only with its value head dim (can_implement)
    mla = not fp8 and q.shape[-1] in AUTO_MLA_QUERY_DIMS
    if q.shape[-1] not in (AUTO_HEAD_DIMS_FP8 if fp8 else AUTO_HEAD_DIMS) and not (d64_long or mla):
        return f"head dim {q.shape[-1]}: the Triton forward is as fast"
    mask = "causal" if opts.causal else "non-causal" if opts.window_left < 0 and opts.window_right < 0 else None
    if fp8 and mask and q.dim() == 4 and q.shape[1] < AUTO_FP8_MIN_ROWS[mask][q.shape[-1]]:
        return f"FP8 {mask} with {q.shape[1]} query rows: the Triton FP8 kernel is faster"
    if opts.softcap > 0.0:
        # its second exp2 and division per score cost this kernel more (0.82-0.87 -> 0.90 ms, NOTES.md)
        return "softcap: the Triton forward is faster"
    return None
# registers by number of consumers: the launch cap (65536 per SM over the program's threads), and the consumers'
# share after setmaxnreg (the producer gives its up)
MAXNREG = {2: 168, 3: 128}
CONSUMER_REGS = gl.constexpr(232)
CONSUMER_REGS_OF_3 = gl.constexpr(160)
# two programs per SM (CTAS_PER_SM=2, two consumers): 65536 / (2 x 384) rounded down to 8; the consumers take 104 and
# leave the producer 32 (what Gluon gives the default partition: the cap's total less the workers')
MAXNREG_TWO_PER_SM = 80
CONSUMER_REGS_TWO_PER_SM = gl.constexpr(104)


def launch_maxnreg(consumers: int, ctas_per_sm: int, free_regs: bool = False) -> int:
    """The launch's register cap (PTX `.maxnreg`) for a tuning."""
    if ctas_per_sm == 1:
        return MAXNREG[consumers]
    if (consumers, ctas_per_sm) != (2, 2):
        raise ValueError(f"CTAS_PER_SM={ctas_per_sm} takes two consumers and at most two programs per SM")
    if free_regs:  # without `.maxnreg` ptxas sizes the launch for one program per SM
        raise ValueError("CTAS_PER_SM=2 needs the launch's register cap: FREE_REGS must be off")
    return MAXNREG_TWO_PER_SM


def default_tuning(head_dim: int, fp8: bool, opts: AttnOptions, head_dim_v: int | None = None) -> dict:
    """CONFIGS' (CONFIGS_FP8's) entry for a call; dense calls take CONFIGS_CAUSAL's (CONFIGS_FP8_CAUSAL's) changes
    to it with a right window edge (causal), CONFIGS_NONCAUSAL's (bf16/fp16) without, and FP8 ones
    CONFIGS_FP8_DENSE's either way. A value head dim unlike the query's takes CONFIGS_MLA's (CONFIGS_MLA_CAUSAL's)."""
    configs, causal, noncausal = ((CONFIGS_FP8, CONFIGS_FP8_CAUSAL, {}) if fp8 else
                                  (CONFIGS, CONFIGS_CAUSAL, CONFIGS_NONCAUSAL))
    if head_dim_v not in (None, head_dim):
        configs, causal, noncausal = CONFIGS_MLA, CONFIGS_MLA_CAUSAL, {}
        head_dim = (head_dim, head_dim_v)
    if opts.varlen:
        return dict(configs[head_dim])
    changes = (causal if opts.window_right >= 0 else noncausal).get(head_dim, {})
    if fp8:
        changes = {**changes, **CONFIGS_FP8_DENSE.get(head_dim, {})}
    return {**configs[head_dim], **changes}


# the shared memory a program may take (sm_90: 227 KB), and what v_transpose_declines keeps free of it for the
# barriers and the compiler's own (the FP8 kernels take 200-500 bytes over their tiles)
SMEM_BYTES = 227 * 1024
SMEM_SPARE = 1024


def fp8_smem_bytes(tuning: dict, head_dim: int, v_transpose: bool) -> int:
    """The FP8 kernel's tiles in shared memory: Q parts, K and V^T stages, two P buffers per consumer, and with
    V_TRANSPOSE the one (BLOCK_N, head_dim) staging buffer."""
    block_n, consumers = tuning["BLOCK_N"], tuning["CONSUMERS"]
    tiles = (tuning["Q_STAGES"] * consumers * int(WG_M) * head_dim + 2 * tuning["STAGES"] * block_n * head_dim
             + consumers * 2 * int(WG_M) * block_n)
    return tiles + (block_n * head_dim if v_transpose else 0)


def v_transpose_asked(tuning: dict, seqlen_q: int, group: int = 1) -> bool:
    """Whether an FP8 call's tuning asks for V_TRANSPOSE: set, or at most V_TRANSPOSE_ROWS query rows per kv head
    (a host key, popped here). Per kv head: the copy transposes each V tile once, the kernel once per query head of
    its group (GQA), so the copy's share of a call falls with the group as with the rows; measured on MHA only."""
    short = seqlen_q * group <= tuning.pop("V_TRANSPOSE_ROWS", 0)
    return bool(tuning.get("V_TRANSPOSE")) or short


def v_transpose_declines(tuning: dict, v: torch.Tensor) -> str | None:
    """Why an FP8 call whose tuning asks for V_TRANSPOSE keeps the keys-last copy of V all the same, or None: the one
    rule of where the in-kernel transpose applies (the plan sets the kernel's V_TRANSPOSE from it)."""
    head_dim = v.shape[-1]
    if tuning["CTAS_PER_SM"] != 1:
        return "two programs per SM: the producer has 32 registers, the transpose's chunks need 16 of them and more"
    chunk = _vt_chunk_layout.fn(head_dim).shape[0]
    if tuning["BLOCK_N"] % chunk:
        return f"BLOCK_N={tuning['BLOCK_N']}: the transpose takes {chunk}-key chunks"
    need = fp8_smem_bytes(tuning, head_dim, True)
    if need + SMEM_SPARE > SMEM_BYTES:
        return f"the staging buffer does not fit: {need} bytes of tiles against {SMEM_BYTES - SMEM_SPARE}"
    if v.dim() != 4 or not tma_usable(v) or common.long_rows(1, v):
        return "V itself not TMA-readable (packed, strides or 64-bit row offsets)"
    return None


def grid_choice(tuning: dict, right_edge: bool, varlen: bool = False) -> tuple[bool, str]:
    """(a persistent grid, the walk of its items) for a call, popping the tuning's PERSISTENT and
    PERSISTENT_CAUSAL. Calls with a right window edge (causal) keep one program per item unless
    PERSISTENT_CAUSAL and dense. The walks (device/tile_order.py):
    - "sections": one program per item, in L2 sections of heads (the hardware hands out items as programs end);
    - "heads": a persistent grid over items that cost alike, one head after another;
    - "scheduled": a persistent causal grid over the sectioned walk, each program taking the items
      schedule_items() gives it. A static stride over that walk, whose costs saw-tooth head by head, left
      programs 1.5x apart (NOTES.md); packed batches' costs are on the device, so they keep "sections"."""
    persistent_causal = tuning.pop("PERSISTENT_CAUSAL", False)
    persistent = tuning.pop("PERSISTENT") and (not right_edge or (persistent_causal and not varlen))
    if not persistent:
        return False, "sections"
    return True, "scheduled" if right_edge else "heads"


def causal_walk_costs(num_blocks: int, num_bh: int, section: int, seqlen_q: int, seqlen_k: int, opts: AttnOptions,
                      block_m: int, block_n: int, item_cost: int = 1) -> np.ndarray:
    """Each item's cost in the sectioned walk of a dense causal (right-edged) call, longest first: its key tiles
    (kv_range_for_q_tile's range), plus item_cost for the item's own prologue and epilogue."""
    block = num_blocks - 1 - sectioned_items(num_blocks, num_bh, section)[0]  # REVERSE_M: the longest first
    start = block * block_m
    last_row = np.minimum(start + block_m, seqlen_q) - 1
    diag = seqlen_k - seqlen_q
    n_hi = np.clip(last_row + diag + opts.window_right + 1, 0, seqlen_k)
    n_lo = np.zeros_like(n_hi)
    if opts.window_left >= 0:
        n_lo = np.clip(start + diag - opts.window_left, 0, seqlen_k) // block_n * block_n
    return np.maximum(-(-(n_hi - n_lo) // block_n), 0) + item_cost


@aggregate
class FwdSmem:
    """A program's shared memory, as one argument of its partitions: the consumers' Q parts (one each: their
    number is q.shape[0]), the ring of K and V stages, their O parts for the TMA store (the Q parts themselves
    unless SEPARATE_O); and the barriers (q_bar / q_empty: Q loaded / free; k_ready, v_ready: a stage's K, its V;
    kv_empty: a stage's K, then its V, released by every consumer; turn: the ping-pong between two
    consumers). P's buffers (FP8) are each consumer's own. With V_TRANSPOSE, vs is the (keys, head_dim) staging
    buffer V's TMA fills and vs_ready its expect-tx barrier; v_ready then means the producer's transpose is in
    (without it, vs and vs_ready alias v and v_ready, unused)."""
    q: gl.shared_memory_descriptor
    k: gl.shared_memory_descriptor
    v: gl.shared_memory_descriptor
    o: gl.shared_memory_descriptor
    q_bar: gl.shared_memory_descriptor
    q_empty: gl.shared_memory_descriptor
    k_ready: gl.shared_memory_descriptor
    v_ready: gl.shared_memory_descriptor
    kv_empty: gl.shared_memory_descriptor
    turn: gl.shared_memory_descriptor
    vs: gl.shared_memory_descriptor
    vs_ready: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, q, k, v, o, q_bar, q_empty, k_ready, v_ready, kv_empty, turn, vs, vs_ready):
        self.q = q
        self.k = k
        self.v = v
        self.o = o
        self.q_bar = q_bar
        self.q_empty = q_empty
        self.k_ready = k_ready
        self.v_ready = v_ready
        self.kv_empty = kv_empty
        self.turn = turn
        self.vs = vs
        self.vs_ready = vs_ready


@aggregate
class FwdFlags:
    """The kernel's compile-time choices as one argument of its partitions and helpers: tile shapes (BLOCK_N keys,
    BLOCK_D Q/K columns, BLOCK_DV value columns), the K/V ring's STAGES, the feature flags and P_SHIFT (FP8's P
    carries 2**8, softmax.online_softmax_update). A new flag is one field here, its value in the kernel, and its
    use."""
    BLOCK_N: gl.constexpr
    BLOCK_D: gl.constexpr
    BLOCK_DV: gl.constexpr
    STAGES: gl.constexpr
    HAS_LEFT: gl.constexpr
    HAS_RIGHT: gl.constexpr
    IS_VARLEN: gl.constexpr
    HAS_SOFTCAP: gl.constexpr
    HAS_ALIBI: gl.constexpr
    REVERSE_M: gl.constexpr
    PINGPONG: gl.constexpr
    IS_FP8: gl.constexpr
    SEPARATE_O: gl.constexpr
    LAZY_O_WAIT: gl.constexpr
    V_TRANSPOSE: gl.constexpr
    P_SHIFT: gl.constexpr
    FIRST_FULL: gl.constexpr
    IDLE_SKIP: gl.constexpr
    ROWS: gl.constexpr
    WARPS: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, BLOCK_N, BLOCK_D, BLOCK_DV, STAGES, HAS_LEFT, HAS_RIGHT, IS_VARLEN, HAS_SOFTCAP, HAS_ALIBI,
                 REVERSE_M, PINGPONG, IS_FP8, SEPARATE_O, LAZY_O_WAIT, V_TRANSPOSE=False, FIRST_FULL=False,
                 ROWS=64, IDLE_SKIP=False):
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.BLOCK_D = gl.constexpr(BLOCK_D)
        self.BLOCK_DV = gl.constexpr(BLOCK_DV)
        self.STAGES = gl.constexpr(STAGES)
        self.HAS_LEFT = gl.constexpr(HAS_LEFT)
        self.HAS_RIGHT = gl.constexpr(HAS_RIGHT)
        self.IS_VARLEN = gl.constexpr(IS_VARLEN)
        self.HAS_SOFTCAP = gl.constexpr(HAS_SOFTCAP)
        self.HAS_ALIBI = gl.constexpr(HAS_ALIBI)
        self.REVERSE_M = gl.constexpr(REVERSE_M)
        self.PINGPONG = gl.constexpr(PINGPONG)
        self.IS_FP8 = gl.constexpr(IS_FP8)
        self.SEPARATE_O = gl.constexpr(SEPARATE_O)
        self.LAZY_O_WAIT = gl.constexpr(LAZY_O_WAIT)
        self.V_TRANSPOSE = gl.constexpr(bool(V_TRANSPOSE))
        self.P_SHIFT = gl.constexpr(8.0 if IS_FP8 else 0.0)
        self.FIRST_FULL = gl.constexpr(FIRST_FULL)
        self.IDLE_SKIP = gl.constexpr(IDLE_SKIP)
        # a consumer partition's query rows and warps (16 rows a warp): one warpgroup, or WIDE's two
        self.ROWS = gl.constexpr(ROWS)
        self.WARPS = gl.constexpr(ROWS // 16)


@aggregate
class FwdOut:
    """What the consumers read and write besides the tiles: Out and Lse with their strides (O's (row, head),
    Lse's (batch, head)), the per-head inputs (ALiBi slopes and their batch stride, FP8's descales, sinks; None
    where the call has none) and the score tail's launch scalars (log2-scaled softmax scale, softcap's factors)."""
    out: _SCALAR
    lse: _SCALAR
    stride_om: _SCALAR
    stride_oh: _SCALAR
    stride_lse_b: _SCALAR
    stride_lse_h: _SCALAR
    alibi_slopes: _SCALAR
    stride_alibi_b: _SCALAR
    q_descale: _SCALAR
    k_descale: _SCALAR
    v_descale: _SCALAR
    sink: _SCALAR
    qk_scale: _SCALAR
    softcap_in2: _SCALAR
    softcap_out: _SCALAR

    @gluon.constexpr_function
    def __init__(self, out, lse, stride_om, stride_oh, stride_lse_b, stride_lse_h, alibi_slopes, stride_alibi_b,
                 q_descale, k_descale, v_descale, sink, qk_scale, softcap_in2, softcap_out):
        self.out = _value(out)
        self.lse = _value(lse)
        self.stride_om = _value(stride_om)
        self.stride_oh = _value(stride_oh)
        self.stride_lse_b = _value(stride_lse_b)
        self.stride_lse_h = _value(stride_lse_h)
        self.alibi_slopes = _value(alibi_slopes)
        self.stride_alibi_b = _value(stride_alibi_b)
        self.q_descale = _value(q_descale)
        self.k_descale = _value(k_descale)
        self.v_descale = _value(v_descale)
        self.sink = _value(sink)
        self.qk_scale = _value(qk_scale)
        self.softcap_in2 = _value(softcap_in2)
        self.softcap_out = _value(softcap_out)


@gluon.jit
def _tile(tile, grid: WorkGrid, lists: BlockLists, BLOCK_M: gl.constexpr, f: FwdFlags):
    """Where work item `tile` lies: (batch, head, first query row, the sequence's bounds, key ranges).
    Items run query tile by query tile over sections of grid.section (batch, head) pairs whose K and V fit in L2
    (device/tile_order.py), so programs running together share them; REVERSE_M (causal) takes the longest
    rows first, so short ones fill the last wave. With a block mask (lists.on) the key "ranges" count visit tiles
    (BLOCK_N apart): the partial blocks' tiles, masked, then the full ones; `visit` says where its lists are."""
    start_m, off_b, off_h, q_start, seqlen_q, k_start, seqlen_k = grid.item(tile, BLOCK_M, f.REVERSE_M, f.IS_VARLEN)
    if lists.on:
        n_lo, n_full_lo, n_full_hi, n_hi, visit = lists.ranges(off_b, off_h, start_m, f.BLOCK_N)
    else:
        n_lo, n_full_lo, n_full_hi, n_hi = kv_range_for_q_tile(start_m, seqlen_q, seqlen_k, grid.window_left,
                                                               grid.window_right, BLOCK_M, f.BLOCK_N, f.HAS_LEFT,
                                                               f.HAS_RIGHT)
        visit = (0, 0, 0)
    return off_b, off_h, start_m, q_start, seqlen_q, k_start, seqlen_k, n_lo, n_full_lo, n_full_hi, n_hi, visit


@gluon.jit
def _producer(q_desc, k_desc, v_desc, sm: FwdSmem, grid: WorkGrid, lists: BlockLists, f: FwdFlags):
    BLOCK_N: gl.constexpr = f.BLOCK_N
    STAGES: gl.constexpr = f.STAGES
    Q_STAGES: gl.constexpr = sm.q_bar.shape[0]
    QK_CHUNKS: gl.constexpr = sm.k.shape[0] // STAGES  # Q and K tiles per part and stage (_issue_s)
    CONSUMERS: gl.constexpr = sm.q.shape[0] // (Q_STAGES * QK_CHUNKS)  # one Q part each per Q stage
    ROWS: gl.constexpr = sm.q.shape[2]
    BLOCK_D: gl.constexpr = q_desc.block_type.shape[3]
    it = 0  # K/V ring slot, counted across work items
    done = 0  # work items finished, for the Q barriers' phases
    first, last, step = grid.steps()
    for tile in range(first, last, step):
        off_b, off_h, start_m, q_start, n_rows, k_start, _, n_lo, _, _, n_hi, visit = _tile(
            tile, grid, lists, CONSUMERS * ROWS, f)
        if start_m < n_rows:  # else a packed sequence shorter than the longest one
            item_it = it  # V_TRANSPOSE: this item's first slot, whose V has no earlier one to transpose first
            tma_b = tma_batch(off_b, f.IS_VARLEN)
            off_hk = off_h // grid.group
            # the consumers free a Q stage (it also stages their O unless SEPARATE_O) when their output is out
            qs = done % Q_STAGES
            q_bar = sm.q_bar.index(qs)
            mbarrier.wait(sm.q_empty.index(qs), free_phase(done, Q_STAGES))
            mbarrier.expect(q_bar, CONSUMERS * QK_CHUNKS * q_desc.block_type.nbytes)
            for w in gl.static_range(CONSUMERS):
                for c in gl.static_range(QK_CHUNKS):
                    tma_load(q_desc, [tma_b, q_start + start_m + w * ROWS, off_h, c * BLOCK_D], q_bar,
                             sm.q.index((qs * CONSUMERS + w) * QK_CHUNKS + c))
            for start_n in range(n_lo, n_hi, BLOCK_N):
                key_n = start_n
                if lists.on:  # start_n counts visit tiles
                    key_n = lists.tile_start(visit, start_n // BLOCK_N, BLOCK_N)
                stage = it % STAGES
                phase = free_phase(it, STAGES)
                mbarrier.wait(sm.kv_empty.index(stage), phase)
                mbarrier.expect(sm.k_ready.index(stage), QK_CHUNKS * k_desc.block_type.nbytes)
                for c in gl.static_range(QK_CHUNKS):
                    tma_load(k_desc, [tma_b, k_start + key_n, off_hk, c * BLOCK_D], sm.k_ready.index(stage),
                             sm.k.index(stage * QK_CHUNKS + c))
                if f.V_TRANSPOSE:
                    # the last slot's V (landed under this K's wait) out of the one staging buffer, then this one's in
                    if it > item_it:
                        _release_staged_v(sm, it - 1, f)
                    mbarrier.expect(sm.vs_ready.index(0), v_desc.block_type.nbytes)
                    tma_load(v_desc, [tma_b, k_start + key_n, off_hk, 0], sm.vs_ready.index(0), sm.vs.index(0))
                else:
                    mbarrier.wait(sm.kv_empty.index(STAGES + stage), phase)
                    mbarrier.expect(sm.v_ready.index(stage), v_desc.block_type.nbytes)
                    if f.IS_FP8:  # V stored (batch, heads, head_dim, keys): a (head_dim, BLOCK_N) tile
                        tma_load(v_desc, [tma_b, off_hk, 0, k_start + key_n], sm.v_ready.index(stage),
                                 sm.v.index(stage))
                    else:
                        tma_load(v_desc, [tma_b, k_start + key_n, off_hk, 0], sm.v_ready.index(stage),
                                 sm.v.index(stage))
                it += 1
            if f.V_TRANSPOSE:
                # the item's last V before the next item's Q: with one Q stage that waits for this item's output
                if it > item_it:
                    _release_staged_v(sm, it - 1, f)
            done += 1


@gluon.constexpr_function
def _vt_chunk_layout(head_dim):
    # registers of a [keys, cols] chunk of staged V for the producer's 4 warps: a thread holds 4 columns of the 16
    # keys 8j + 2t + i (j < 8, i < 2) that RELABEL_KEYS moves to 16t .. 16t + 15, so it reads 4 bytes a key and
    # writes 16 bytes a column; cols = 128 (64 keys) or 64 (128 keys): 64 bytes a thread, within the producer's 40
    # registers
    cols = min(head_dim, 128)
    warp = [[0, 32], [0, 64]] if cols == 128 else [[0, 32], [64, 0]]
    return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [1, 0], [8, 0], [16, 0], [32, 0]],
                                      lane_bases=[[2, 0], [4, 0], [0, 4], [0, 8], [0, 16]], warp_bases=warp,
                                      block_bases=[], shape=[8192 // cols, cols])


@gluon.jit
def _transpose_v(src, dst):
    """Staged V src [BLOCK_N keys, head_dim] -> dst [head_dim, BLOCK_N] (K-major, as the PV wgmma reads FP8's V),
    keys relabelled within each 64 as P's stores are (v_layout.RELABEL_KEYS), chunk by chunk through registers."""
    BLOCK_N: gl.constexpr = src.shape[0]
    HEAD_DIM: gl.constexpr = src.shape[1]
    layout: gl.constexpr = _vt_chunk_layout(HEAD_DIM)
    KEYS: gl.constexpr = layout.shape[0]
    COLS: gl.constexpr = layout.shape[1]
    for k0 in gl.static_range(0, BLOCK_N, KEYS):
        for c0 in gl.static_range(0, HEAD_DIM, COLS):
            x = src.slice(k0, KEYS, 0).slice(c0, COLS, 1).load(layout)
            # key 8j + 2t + i of each 64 to place 16t + 2j + i: a relabelling of registers, no data moves
            x = x.reshape([KEYS // 64, 8, 4, 2, COLS]).permute([0, 2, 1, 3, 4]).reshape([KEYS, COLS])
            dst.slice(c0, COLS, 0).slice(k0, KEYS, 1).store(x.permute([1, 0]))


@gluon.jit
def _release_staged_v(sm: FwdSmem, it, f: FwdFlags):
    """V_TRANSPOSE: slot it's V, once landed in the staging buffer, into its K-major stage when the consumers are done
    with that stage's last PV; v_ready then hands it to them, and the staging buffer is free for the next TMA."""
    stage = it % f.STAGES
    mbarrier.wait(sm.vs_ready.index(0), ready_phase(it, 1))
    mbarrier.wait(sm.kv_empty.index(f.STAGES + stage), free_phase(it, f.STAGES))
    _transpose_v(sm.vs.index(0).reshape([f.BLOCK_N, f.BLOCK_DV]), sm.v.index(stage).reshape([f.BLOCK_DV, f.BLOCK_N]))
    fence_async_shared()  # each thread's stores visible to the wgmma's async proxy
    thread_barrier()  # every thread's, before one arrival says so (and their staging reads done before its TMA)
    mbarrier.arrive(sm.v_ready.index(stage), count=1)


@gluon.constexpr_function
def _value_width(v_block, is_fp8):
    # V's head dim from its descriptor's block: (1, keys, 1, head_dim), FP8's V^T (1, 1, head_dim, keys)
    return v_block[2] if is_fp8 else v_block[3]


@gluon.constexpr_function
def _vt_smem_layout(head_dim, block_n):
    # V_TRANSPOSE's V^T stages: the layout TMA gives the keys-last copy's (1, 1, head_dim, BLOCK_N) tiles
    return gl.NVMMASharedLayout.get_default_for([1, 1, head_dim, block_n], gl.float8e4nv)


@gluon.constexpr_function
def _p_smem_layout(block_n):
    # FP8's P as the shared A operand of O += P V (K-major: rows of keys)
    return gl.NVMMASharedLayout.get_default_for([64, block_n], gl.float8e4nv)


@gluon.jit
def _issue_s(sm: FwdSmem, q_part, stage, f: FwdFlags):
    """S = Q K_stageᵀ for Q part q_part, asynchronously: one matmul, or one per BLOCK_D-column chunk of Q and K
    accumulated in turn where the query head dim is no power of two (MLA's 192 = 3 x 64: QK_CHUNKS tiles each)."""
    QK_CHUNKS: gl.constexpr = sm.k.shape[0] // sm.k_ready.shape[0]
    s_layout: gl.constexpr = wgmma_layout(f.BLOCK_N, sm.q.dtype.primitive_bitwidth, f.WARPS)
    tok = gl.zeros([f.ROWS, f.BLOCK_N], gl.float32, s_layout)
    for c in gl.static_range(QK_CHUNKS):
        q_c = sm.q.index(q_part * QK_CHUNKS + c).reshape([f.ROWS, f.BLOCK_D])
        k_t = sm.k.index(stage * QK_CHUNKS + c).reshape([f.BLOCK_N, f.BLOCK_D]).permute([1, 0])
        tok = warpgroup_mma(q_c, k_t, tok, use_acc=c > 0, is_async=True)
    return tok


@gluon.jit
def _v_tile(v_smem, stage, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, IS_FP8: gl.constexpr):
    """Stage `stage` of V as the (BLOCK_N, BLOCK_D) B operand of O += P V (K-major for FP8)."""
    if IS_FP8:
        v = v_smem.index(stage).reshape([BLOCK_D, BLOCK_N]).permute([1, 0])
    else:
        v = v_smem.index(stage).reshape([BLOCK_N, BLOCK_D])
    return v


@gluon.jit
def _probs(s, m_i, l_i, offs_m, start_n, seqlen_q, seqlen_k, qk_scale, window_left, window_right, softcap_in2,
           softcap_out, alibi_slope, lists: BlockLists, visit, mod: ScoreMod, dtype: gl.constexpr, f: FwdFlags,
           MASKED: gl.constexpr):
    """Raw scores of one tile -> P (dtype, in the PV matmul's A-operand layout; FP8: as computed, for its
    shared buffer), alpha, new m_i, l_i. With a block mask, start_n is the visit tile's place (BLOCK_N apart) and
    only partial blocks' bits mask (the plan takes whole blocks only: no sequence end inside one); a score_mod
    (mod.on) applies before the mask, and any of its tiles may hold -inf."""
    BLOCK_N: gl.constexpr = f.BLOCK_N
    key0 = start_n
    if lists.on and mod.on:
        key0 = lists.tile_start(visit, start_n // BLOCK_N, BLOCK_N)  # the keys' own positions, for the mod
    offs_n = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
    s = mod.scores(s, offs_m[:, None], offs_n[None, :])
    if lists.on and MASKED:
        s = lists.mask(s, visit, start_n // BLOCK_N, offs_m, BLOCK_N)
    s, scale, _ = score_tail(s, offs_m[:, None], offs_n[None, :], seqlen_q, seqlen_k, qk_scale, window_left,
                             window_right, softcap_in2, softcap_out, alibi_slope, f.HAS_LEFT, f.HAS_RIGHT,
                             f.HAS_SOFTCAP, f.HAS_ALIBI, MASKED and not lists.on)
    p, alpha, m_i, l_i = online_softmax_update(s, m_i, l_i, scale, MASKED or mod.on, f.P_SHIFT)
    if f.IS_FP8:
        p = p.to(dtype)
    else:
        p = gl.convert_layout(to_half2(p, dtype), p_layout(f.BLOCK_DV, 16, f.WARPS))
    return p, alpha, m_i, l_i


@gluon.jit
def _keep_p(p, p_smem, it, IS_FP8: gl.constexpr):
    """P of key tile `it` as the next PV matmul takes it. FP8: into shared buffer it % 2 (the other one may
    still feed the PV in flight): wgmma waits cannot hold 8-bit registers live, so the carried value is a
    placeholder."""
    if IS_FP8:
        # keys relabelled within each 64 as V's copy is (v_layout.RELABEL_KEYS): 16-byte stores, not 2-byte
        n: gl.constexpr = p.shape[1]
        p = p.reshape([WG_M, n // 64, 8, 4, 2]).permute([0, 1, 3, 2, 4]).reshape([WG_M, n])
        p_smem.index(it % 2).store(p)
        fence_async_shared()
        p = it
    return p


@gluon.jit
def _issue_pv(p, p_smem, it, v_smem, acc, f: FwdFlags):
    """O += P_it V_it, asynchronously: P from registers, FP8's from its shared buffer."""
    v = _v_tile(v_smem, it % f.STAGES, f.BLOCK_N, f.BLOCK_DV, f.IS_FP8)
    if f.IS_FP8:
        tok = warpgroup_mma(p_smem.index(it % 2), v, acc, is_async=True)
    else:
        tok = warpgroup_mma(p, v, acc, is_async=True)
    return tok


@gluon.jit
def _wait_pv(o_tok, p, IS_FP8: gl.constexpr):
    """Wait for the PV matmul; register P stays a dependency, since it feeds the matmul until it retires."""
    if IS_FP8:
        acc = warpgroup_mma_wait(0, deps=[o_tok])
    else:
        acc, p = warpgroup_mma_wait(0, deps=[o_tok, p])
    return acc, p


@gluon.jit
def _release(bar, f: FwdFlags):
    """A consumer partition's arrival on `bar` (one thread's): WIDE's two warpgroups first meet, since the wait
    before it covers only the arriving thread's warpgroup's wgmma."""
    if f.WARPS > 4:
        thread_barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _take_turn(turn, turns, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: the two consumers issue their matmuls in turns, so that one's softmax runs while the
    other's matmuls hold the tensor cores. Consumer 0 goes first: its first wait is on the phase a
    fresh barrier counts as complete."""
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (turns & 1) ^ (1 - WG))


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG), count=1)


@gluon.jit
def _step(it, turns, start_n, acc, m_i, l_i, p, q_part, sm: FwdSmem, p_smem, offs_m, seqlen_q, seqlen_k, qk_scale,
          window_left, window_right, softcap_in2, softcap_out, alibi_slope, lists: BlockLists, visit, mod: ScoreMod,
          WG: gl.constexpr, f: FwdFlags, MASKED: gl.constexpr):
    """Key tile `it` (at start_n): S_it = Q K_itᵀ and O += P_{it-1} V_{it-1} in flight together, the
    softmax of S_it under the PV matmul, then O rescaled and stage it-1 handed back."""
    STAGES: gl.constexpr = f.STAGES
    stage = it % STAGES
    prev = (it - 1) % STAGES
    mbarrier.wait(sm.k_ready.index(stage), ready_phase(it, STAGES))
    mbarrier.wait(sm.v_ready.index(prev), ready_phase(it - 1, STAGES))
    _take_turn(sm.turn, turns, WG, f.PINGPONG)
    s_tok = _issue_s(sm, q_part, stage, f)
    o_tok = _issue_pv(p, p_smem, it - 1, sm.v, acc, f)
    _pass_turn(sm.turn, WG, f.PINGPONG)
    s = warpgroup_mma_wait(1, deps=[s_tok])
    _release(sm.kv_empty.index(stage), f)
    p_next, alpha, m_i, l_i = _probs(s, m_i, l_i, offs_m, start_n, seqlen_q, seqlen_k, qk_scale, window_left,
                                     window_right, softcap_in2, softcap_out, alibi_slope, lists, visit, mod,
                                     sm.q.dtype, f, MASKED)
    p_next = _keep_p(p_next, p_smem, it, f.IS_FP8)
    acc, p = _wait_pv(o_tok, p, f.IS_FP8)
    _release(sm.kv_empty.index(STAGES + prev), f)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
    return acc, m_i, l_i, p_next


@gluon.jit
def _attend(q_part, sm: FwdSmem, p_smem, it, turns, offs_m, seqlen_q, seqlen_k, n_lo, n_full_lo, n_full_hi, n_hi,
            qk_scale, window_left, window_right, softcap_in2, softcap_out, alibi_slope, lists: BlockLists, visit,
            mod: ScoreMod, WG: gl.constexpr, f: FwdFlags):
    """One consumer's 64 rows of a work item over key tiles [n_lo, n_hi): (acc, m_i, l_i, it, turns).
    `it` (the ring slot) and `turns` (ping-pong turns taken) run on across work items."""
    BLOCK_N: gl.constexpr = f.BLOCK_N
    STAGES: gl.constexpr = f.STAGES
    PINGPONG: gl.constexpr = f.PINGPONG
    bits: gl.constexpr = sm.q.dtype.primitive_bitwidth
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N, bits, f.WARPS)
    m_i = gl.full([f.ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([f.ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([f.ROWS, f.BLOCK_DV], gl.float32, wgmma_layout(f.BLOCK_DV, bits, f.WARPS))
    if n_hi > n_lo:
        # the first tile alone: its S has no PV to overlap with (masked: it may be cut by anything)
        stage = it % STAGES
        mbarrier.wait(sm.k_ready.index(stage), ready_phase(it, STAGES))
        _take_turn(sm.turn, turns, WG, PINGPONG)
        s_tok = _issue_s(sm, q_part, stage, f)
        _pass_turn(sm.turn, WG, PINGPONG)
        s = warpgroup_mma_wait(0, deps=[s_tok])
        _release(sm.kv_empty.index(stage), f)
        # FIRST_FULL: a first tile every row sees whole (causal items past the first block, most non-causal ones)
        # skips the mask: both versions compiled, one uniform branch. P is kept inside each branch: FP8's 8-bit P
        # carried out of the branch came out wrong (H200, 2026-11-28)
        if f.FIRST_FULL and not lists.on and (n_lo >= n_full_lo) & (n_lo + BLOCK_N <= n_full_hi):
            p, _, m_i, l_i = _probs(s, m_i, l_i, offs_m, n_lo, seqlen_q, seqlen_k, qk_scale, window_left, window_right,
                                    softcap_in2, softcap_out, alibi_slope, lists, visit, mod, sm.q.dtype, f, False)
            p = _keep_p(p, p_smem, it, f.IS_FP8)
        else:
            p, _, m_i, l_i = _probs(s, m_i, l_i, offs_m, n_lo, seqlen_q, seqlen_k, qk_scale, window_left, window_right,
                                    softcap_in2, softcap_out, alibi_slope, lists, visit, mod, sm.q.dtype, f, True)
            p = _keep_p(p, p_smem, it, f.IS_FP8)
        it += 1
        turns += 1
        first = n_lo + BLOCK_N
        full_lo = gl.maximum(n_full_lo, first)
        full_hi = gl.maximum(n_full_hi, first)
        # tiles cut by the window's left edge (masked; none without one), tiles every row sees whole, then the
        # diagonal, the window's right edge and the keys' end (masked)
        bounds = (first, full_lo, full_hi, n_hi)
        for r in gl.static_range(3):
            if r != 0 or f.HAS_LEFT or lists.on:  # a block mask's partial blocks come first
                for start_n in range(bounds[r], bounds[r + 1], BLOCK_N):
                    acc, m_i, l_i, p = _step(it, turns, start_n, acc, m_i, l_i, p, q_part, sm, p_smem, offs_m,
                                             seqlen_q, seqlen_k, qk_scale, window_left, window_right, softcap_in2,
                                             softcap_out, alibi_slope, lists, visit, mod, WG, f, r != 1)
                    it += 1
                    turns += 1
        # the last PV
        prev = (it - 1) % STAGES
        mbarrier.wait(sm.v_ready.index(prev), ready_phase(it - 1, STAGES))
        _take_turn(sm.turn, turns, WG, PINGPONG)
        o_tok = _issue_pv(p, p_smem, it - 1, sm.v, acc, f)
        _pass_turn(sm.turn, WG, PINGPONG)
        acc, p = _wait_pv(o_tok, p, f.IS_FP8)
        _release(sm.kv_empty.index(STAGES + prev), f)
        turns += 1
    return acc, m_i, l_i, it, turns


@gluon.jit
def _walk_idle(sm: FwdSmem, it, turns, n_lo, n_hi, WG: gl.constexpr, f: FwdFlags):
    """_attend's stage hand-backs and ping-pong turns, in its order, without its matmuls: for a consumer whose rows
    all lie past the sequence's end (IDLE_SKIP), so that its partners have the tensor cores to themselves."""
    STAGES: gl.constexpr = f.STAGES
    if n_hi > n_lo:
        for _start_n in range(n_lo, n_hi, f.BLOCK_N):
            stage = it % STAGES
            mbarrier.wait(sm.k_ready.index(stage), ready_phase(it, STAGES))
            _take_turn(sm.turn, turns, WG, f.PINGPONG)
            _pass_turn(sm.turn, WG, f.PINGPONG)
            _release(sm.kv_empty.index(stage), f)
            mbarrier.wait(sm.v_ready.index(stage), ready_phase(it, STAGES))
            _release(sm.kv_empty.index(STAGES + stage), f)
            it += 1
            turns += 1
        _take_turn(sm.turn, turns, WG, f.PINGPONG)  # _attend's last PV takes a turn of its own
        _pass_turn(sm.turn, WG, f.PINGPONG)
        turns += 1
    return it, turns


@gluon.jit
def _consumer(WG: gl.constexpr, sm: FwdSmem, p_smem, o_desc, io: FwdOut, grid: WorkGrid, lists: BlockLists,
              mod: ScoreMod, f: FwdFlags):
    BLOCK_DV: gl.constexpr = f.BLOCK_DV
    IS_FP8: gl.constexpr = f.IS_FP8
    SEPARATE_O: gl.constexpr = f.SEPARATE_O
    LAZY_O_WAIT: gl.constexpr = f.LAZY_O_WAIT
    bits: gl.constexpr = sm.q.dtype.primitive_bitwidth
    ROWS: gl.constexpr = f.ROWS
    s_layout: gl.constexpr = wgmma_layout(f.BLOCK_N, bits, f.WARPS)
    o_layout: gl.constexpr = wgmma_layout(BLOCK_DV, bits, f.WARPS)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = io.out.dtype.element_ty
    Q_STAGES: gl.constexpr = sm.q_bar.shape[0]
    QK_CHUNKS: gl.constexpr = sm.k.shape[0] // f.STAGES
    CONSUMERS: gl.constexpr = sm.q.shape[0] // (Q_STAGES * QK_CHUNKS)
    it = 0
    turns = 0
    done = 0
    first, last, step = grid.steps()
    for tile in range(first, last, step):
        off_b, off_h, start_m, q_start, n_rows, _, n_keys, n_lo, n_full_lo, n_full_hi, n_hi, visit = _tile(
            tile, grid, lists, CONSUMERS * ROWS, f)
        if start_m < n_rows:
            alibi_slope = alibi_slope_of(io.alibi_slopes, off_b, off_h, io.stride_alibi_b, f.HAS_ALIBI)
            tile_scale = io.qk_scale
            tile_softcap_in2 = io.softcap_in2
            v_descale = 1.0
            if IS_FP8:
                tile_scale, tile_softcap_in2, v_descale = fp8_scales(io.q_descale, io.k_descale, io.v_descale, off_b,
                                                                     off_h // grid.group, grid.heads // grid.group,
                                                                     io.qk_scale, io.softcap_in2)
            row0 = start_m + WG * ROWS
            offs_m = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
            qs = done % Q_STAGES
            q_part = qs * CONSUMERS + WG
            mbarrier.wait(sm.q_bar.index(qs), ready_phase(done, Q_STAGES))
            if f.IDLE_SKIP and not lists.on and row0 >= n_rows:
                # every row of this consumer lies past the sequence's end (the last of three consumers' 192-row items
                # at 512 rows, ragged lengths): its output is never stored
                it, turns = _walk_idle(sm, it, turns, n_lo, n_hi, WG, f)
                acc = gl.zeros([ROWS, BLOCK_DV], gl.float32, o_layout)
                m_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
                l_i = gl.full([ROWS], 1.0, gl.float32, gl.SliceLayout(1, s_layout))
            else:
                acc, m_i, l_i, it, turns = _attend(q_part, sm, p_smem, it, turns, offs_m, n_rows, n_keys, n_lo,
                                                   n_full_lo, n_full_hi, n_hi, tile_scale, grid.window_left,
                                                   grid.window_right, tile_softcap_in2, io.softcap_out, alibi_slope,
                                                   lists, visit, mod.at(off_b, off_h), WG, f)
            if SEPARATE_O:
                # every S of this item retired inside _attend: the producer may load the next item's Q now
                _release(sm.q_empty.index(qs), f)

            out, lse = finalize(acc, gl.convert_layout(m_i, row_o), gl.convert_layout(l_i, row_o), f.P_SHIFT, io.sink,
                                off_h)
            if lists.on:
                lse = gl.where(lse == float("inf"), float("-inf"), lse)  # FlexAttention's row that sees no key
            if IS_FP8:
                out = out * v_descale
            rows = row0 + gl.arange(0, ROWS, layout=row_o)
            lse_base = io.lse + off_b.to(gl.int64) * io.stride_lse_b + off_h.to(gl.int64) * io.stride_lse_h + q_start
            gl.store(lse_base + rows, lse, mask=rows < n_rows)
            if f.IS_VARLEN or IS_FP8 or QK_CHUNKS > 1:
                # packed rows end at each sequence; FP8's bf16 O does not fit its e4m3 Q stage, nor an O of another
                # width Q's chunks (MLA)
                cols = gl.arange(0, BLOCK_DV, layout=gl.SliceLayout(0, o_layout))
                if f.IS_VARLEN:
                    o_rows = (q_start + rows).to(gl.int64)
                else:
                    o_rows = off_b.to(gl.int64) * grid.seqlen_q + rows  # dense: O is this plan's contiguous output
                o_ptrs = io.out + off_h.to(gl.int64) * io.stride_oh + o_rows[:, None] * io.stride_om + cols[None, :]
                gl.store(o_ptrs, out.to(dtype), mask=(rows[:, None] < n_rows) & (cols[None, :] < BLOCK_DV))
            else:
                # O staged for one TMA store: in this half's Q part (free now that its last S retired), or with
                # SEPARATE_O in its own buffer, whose last store LAZY_O_WAIT waits for only when it is written again
                if SEPARATE_O:
                    o_stage = sm.o.index(WG)
                else:
                    o_stage = sm.q.index(q_part)
                if LAZY_O_WAIT and SEPARATE_O:
                    tma_store_wait(0)
                o_stage.reshape([ROWS, BLOCK_DV]).store(out.to(dtype))
                fence_async_shared()
                tma_store(o_desc, [off_b, row0, off_h, 0], o_stage)
                if not (LAZY_O_WAIT and SEPARATE_O):
                    tma_store_wait(0)
            if not SEPARATE_O:
                _release(sm.q_empty.index(qs), f)
            done += 1
    if LAZY_O_WAIT and SEPARATE_O:
        tma_store_wait(0)  # the last item's O is out before the program ends


# seqlen_q is never folded in: ptxas (CUDA 12.8) dies with SIGSEGV on FP8 kernels specialised to one query row together
# with other folded ones (section = 1; or batch, heads and group 1 with section 2), found by fuzz seed 5 and the
# 2026-11-27 FP8 loops; unfolded, every such combination compiles. Folded, the first FP8 one-row call after a bf16
# one with CTAS_PER_SM=2 also gave an all-NaN output (3 of 3 processes; unfolded 0 of 4, NOTES.md)
UNSPECIALIZED = ROW_COUNTS + ("seqlen_q",)


@gluon.constexpr_function
def _partitions(consumers, wide):
    # consumer partitions: one a warpgroup, or WIDE's one for all
    return 1 if wide else consumers


@gluon.jit(do_not_specialize=UNSPECIALIZED)
def attention_fwd_sm90_kernel(
    q_desc, k_desc, v_desc, o_desc, Out, Lse, CuSeqlensQ, CuSeqlensK, AlibiSlopes, QDescale, KDescale, VDescale,
    Schedule, Sink, stride_o, stride_lse, stride_alibi_b,
    batch, nheads, group, seqlen_q, seqlen_k, total_q, total_k, qk_scale, window_left, window_right, softcap_in2,
    softcap_out, section,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
    IS_VARLEN: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, REVERSE_M: gl.constexpr,
    PINGPONG: gl.constexpr, IS_FP8: gl.constexpr, SEPARATE_O: gl.constexpr, CONSUMERS: gl.constexpr,
    Q_STAGES: gl.constexpr, LAZY_O_WAIT: gl.constexpr,
    KvNum=None, KvIndices=None, PartialIds=None, FullNum=None, FullIndices=None, MaskBits=None, stride_num=None,
    stride_idx=None, SPARSE_Q: gl.constexpr = 128, SPARSE_KV: gl.constexpr = 128,
    MOD_FN: gl.constexpr = None, MOD_GRAD: gl.constexpr = None, captures=None, mod_scale=1.0,
    QK_CHUNKS: gl.constexpr = 1, FREE_REGS: gl.constexpr = False, CTAS_PER_SM: gl.constexpr = 1,
    V_TRANSPOSE: gl.constexpr = False, FIRST_FULL: gl.constexpr = False, WIDE: gl.constexpr = False,
    IDLE_SKIP: gl.constexpr = False,
):
    """The contract of forward.attention_fwd_kernel without dropout: Out, and Lse in natural log (+inf
    for rows that see no key). q/k/v/o_desc are descriptors over (batch, seqlen, heads, head_dim) with
    (1, rows, 1, head_dim) blocks; packed inputs come as (1, total, heads, head_dim) views.

    The work items are the (64 x CONSUMERS-row query tile, batch x head) pairs; program i takes items i, i + grid,
    ... (a persistent grid when the launch is smaller than the work: the producer then loads the next
    item's tiles while the consumers finish the last one's output). stride_o: O's (row, head) strides (its
    pointer stores), stride_lse: Lse's (batch, head).

    Block-sparse mode (KvNum given; flex_attention): each item visits the key blocks of a BlockMask's lists (see
    BlockLists; stride_num: the counts' (batch, head) strides, stride_idx: the lists' (batch, head, query block)
    ones), partial blocks masked by MaskBits; SPARSE_Q / SPARSE_KV its block sizes. Lse is -inf for rows that see
    no key, as FlexAttention gives. A score_mod (MOD_FN, see ScoreMod; captures: its tensors, mod_scale: the
    softmax scale, qk_scale then log2(e)) applies to every score before the mask. QK_CHUNKS > 1 (a value head dim
    unlike the query's, MLA's 192/128): q/k_desc hand out 64-column tiles, QK_CHUNKS per row tile, and O leaves
    through pointer stores. FREE_REGS is not read here: it keys the compile made under common.free_registers.
    CTAS_PER_SM=2: the consumers' registers for two programs per SM (the launch's cap is launch_maxnreg's).
    V_TRANSPOSE (FP8): v_desc hands out (1, BLOCK_N, 1, head_dim) tiles of V itself, which the producer transposes
    (_release_staged_v), instead of (1, 1, head_dim, BLOCK_N) tiles of its keys-last copy."""
    stride_om, stride_oh = stride_o
    stride_lse_b, stride_lse_h = stride_lse
    BLOCK_D: gl.constexpr = q_desc.block_type.shape[3]  # Q and K tiles' width (a chunk's with QK_CHUNKS > 1)
    BLOCK_DV: gl.constexpr = _value_width(v_desc.block_type.shape, IS_FP8 and not V_TRANSPOSE)
    dtype: gl.constexpr = q_desc.dtype
    num_m = gl.cdiv(seqlen_q, CONSUMERS * WG_M)
    # WIDE: the CONSUMERS warpgroups (two) as one partition of 8 warps, one code copy, a Q part of their 128 rows
    PARTS: gl.constexpr = _partitions(CONSUMERS, WIDE)
    ROWS: gl.constexpr = CONSUMERS * WG_M // PARTS
    grid = WorkGrid(num_m, num_m * batch * nheads, section, nheads, group, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k,
                    total_q, total_k, window_left, window_right, Schedule)
    if KvNum is None:
        lists = BlockLists(None, None, None, None, None, None, None, None, None, None, None, SPARSE_Q, SPARSE_KV)
    else:
        lists = BlockLists(KvNum, KvIndices, PartialIds, FullNum, FullIndices, MaskBits, stride_num[0],
                           stride_num[1], stride_idx[0], stride_idx[1], stride_idx[2], SPARSE_Q, SPARSE_KV)
    mod = ScoreMod(MOD_FN, MOD_GRAD, captures, mod_scale)

    q_smem = gl.allocate_shared_memory(dtype, [Q_STAGES * PARTS * QK_CHUNKS, 1, ROWS, 1, BLOCK_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES * QK_CHUNKS, 1, BLOCK_N, 1, BLOCK_D], k_desc.layout)
    if IS_FP8 and V_TRANSPOSE:
        # V's (keys, head_dim) tiles land in one staging buffer, whence the producer writes the V^T stages
        vs_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, 1, BLOCK_D], v_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_D, BLOCK_N], _vt_smem_layout(BLOCK_D, BLOCK_N))
        p_smem0 = gl.allocate_shared_memory(dtype, [2, WG_M, BLOCK_N], _p_smem_layout(BLOCK_N))
        p_smem1 = gl.allocate_shared_memory(dtype, [2, WG_M, BLOCK_N], _p_smem_layout(BLOCK_N))
    elif IS_FP8:
        # V^T tiles: v_desc is over (batch, heads, head_dim, keys); P: two buffers per consumer
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_D, BLOCK_N], v_desc.layout)
        p_smem0 = gl.allocate_shared_memory(dtype, [2, WG_M, BLOCK_N], _p_smem_layout(BLOCK_N))
        p_smem1 = gl.allocate_shared_memory(dtype, [2, WG_M, BLOCK_N], _p_smem_layout(BLOCK_N))
    else:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, 1, BLOCK_DV], v_desc.layout)
        p_smem0 = q_smem  # unused
        p_smem1 = q_smem
    q_bar = gl.allocate_shared_memory(gl.int64, [Q_STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_STAGES, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    if IS_FP8 and V_TRANSPOSE:
        vs_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(vs_ready.index(0), count=1)
    else:
        vs_smem = v_smem  # unused
        vs_ready = v_ready
    for i in gl.static_range(Q_STAGES):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=PARTS)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=PARTS)
        mbarrier.init(kv_empty.index(STAGES + i), count=PARTS)
    fence_async_shared()  # the inits visible to the async proxy (TMA's complete-tx), as CUDA's TMA guide fences

    if SEPARATE_O and not (IS_VARLEN or IS_FP8 or QK_CHUNKS > 1):  # the others store O from registers
        o_smem = gl.allocate_shared_memory(dtype, [PARTS, 1, ROWS, 1, BLOCK_DV], o_desc.layout)
    else:
        o_smem = q_smem
    sm = FwdSmem(q_smem, k_smem, v_smem, o_smem, q_bar, q_empty, k_ready, v_ready, kv_empty, turn, vs_smem, vs_ready)
    f = FwdFlags(BLOCK_N, BLOCK_D, BLOCK_DV, STAGES, HAS_LEFT, HAS_RIGHT, IS_VARLEN, HAS_SOFTCAP, HAS_ALIBI, REVERSE_M,
                 PINGPONG, IS_FP8, SEPARATE_O, LAZY_O_WAIT, IS_FP8 and V_TRANSPOSE, FIRST_FULL, ROWS, IDLE_SKIP)
    io = FwdOut(Out, Lse, stride_om, stride_oh, stride_lse_b, stride_lse_h, AlibiSlopes, stride_alibi_b, QDescale,
                KDescale, VDescale, Sink, qk_scale, softcap_in2, softcap_out)
    consumer_regs: gl.constexpr = CONSUMER_REGS if CTAS_PER_SM == 1 else CONSUMER_REGS_TWO_PER_SM
    # two launches of the same partitions: Gluon (3.6) takes the partition list only as a literal (a list held
    # in a variable, or tuples joined with +, do not compile)
    if WIDE:  # no ping-pong, no FP8, two warpgroups (the plan checks)
        gl.warp_specialize([
            (_producer, (q_desc, k_desc, v_desc, sm, grid, lists, f)),
            (_consumer, (0, sm, p_smem0, o_desc, io, grid, lists, mod, f)),
        ], [8], [consumer_regs])
    elif CONSUMERS == 3:  # no ping-pong, no FP8 (the plan checks): the third consumer shares the first's P buffer
        gl.warp_specialize([
            (_producer, (q_desc, k_desc, v_desc, sm, grid, lists, f)),
            (_consumer, (0, sm, p_smem0, o_desc, io, grid, lists, mod, f)),
            (_consumer, (1, sm, p_smem1, o_desc, io, grid, lists, mod, f)),
            (_consumer, (2, sm, p_smem0, o_desc, io, grid, lists, mod, f)),
        ], [4, 4, 4], [CONSUMER_REGS_OF_3, CONSUMER_REGS_OF_3, CONSUMER_REGS_OF_3])
    else:
        gl.warp_specialize([
            (_producer, (q_desc, k_desc, v_desc, sm, grid, lists, f)),
            (_consumer, (0, sm, p_smem0, o_desc, io, grid, lists, mod, f)),
            (_consumer, (1, sm, p_smem1, o_desc, io, grid, lists, mod, f)),
        ], [4, 4], [consumer_regs, consumer_regs])

    for i in gl.static_range(Q_STAGES):
        mbarrier.invalidate(q_bar.index(i))
        mbarrier.invalidate(q_empty.index(i))
    mbarrier.invalidate(turn.index(0))
    mbarrier.invalidate(turn.index(1))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(i))
        mbarrier.invalidate(v_ready.index(i))
        mbarrier.invalidate(kv_empty.index(i))
        mbarrier.invalidate(kv_empty.index(STAGES + i))
    if IS_FP8 and V_TRANSPOSE:
        mbarrier.invalidate(vs_ready.index(0))


def can_implement(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions,
                  return_probs: bool) -> str | None:
    """None when this kernel runs the call, else what keeps it on the portable kernels."""
    dropout = opts.dropout_p > 0.0 or return_probs
    if v.shape[-1] != q.shape[-1]:  # MLA: Q and K in 64-column tiles, V and O at their own head dim
        if (q.shape[-1], v.shape[-1]) not in CONFIGS_MLA:
            return (f"a value head dim unlike the query's: {q.shape[-1]}/{v.shape[-1]} (the Gluon kernel has "
                    f"{sorted(CONFIGS_MLA)})")
        return sm90_declines(q, [q.shape[-1]], "kernel", dropout, k, v, unlike_v=1)
    if q.dtype == torch.float8_e4m3fn:
        if opts.varlen:
            # a sequence's keys start anywhere in the packed V^T rows: on the H100 the TMA loads from such
            # offsets stopped the kernel with an illegal instruction (NOTES.md); pointer loads take them
            return "packed (varlen) FP8 batches: the Triton FP8 kernel runs them"
        # V is read from the plan's own aligned copy
        return sm90_declines(q, CONFIGS_FP8, "kernel", dropout, k, dtypes=(torch.float8_e4m3fn,))
    return sm90_declines(q, CONFIGS, "kernel", dropout, k, v)


class Sm90ForwardPlan:
    """ForwardPlan's interface (portable/forward.py) for the Gluon kernel: made once per shape and option set."""

    backend = "gluon-sm90"

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions,
                 tuning: dict | None = None) -> None:
        batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim = problem_dims(q, k, opts)
        varlen = opts.varlen
        self.fp8 = fp8 = q.dtype == torch.float8_e4m3fn
        head_dim_v = v.shape[-1]
        qk_chunks = head_dim // MLA_CHUNK if head_dim_v != head_dim else 1
        tuning = {**default_tuning(head_dim, fp8, opts, head_dim_v), **(tuning or {})}
        if seqlen_q < tuning.pop("FIRST_FULL_MIN_ROWS", 0):  # where the branch's second copy costs more than it saves
            tuning["FIRST_FULL"] = False
        block_n, consumers = tuning["BLOCK_N"], tuning["CONSUMERS"]
        if consumers == 3 and (fp8 or tuning["PINGPONG"]):
            raise ValueError("CONSUMERS=3 takes neither FP8 nor ping-pong (PINGPONG)")
        wide = tuning.get("WIDE", False)
        if wide and (consumers != 2 or fp8 or tuning["PINGPONG"] or head_dim_v != head_dim
                     or tuning["CTAS_PER_SM"] != 1):
            raise ValueError("WIDE takes two consumers, one program an SM, and neither FP8, ping-pong nor MLA")
        block_m = consumers * int(WG_M)
        num_tiles = cdiv(seqlen_q, block_m) * batch * nheads
        section, l2_share = 1, tuning.pop("L2_SECTIONS")  # 1/n of L2 per section; 0: no sections
        item_cost = tuning.pop("ITEM_COST")
        free_regs = tuning["FREE_REGS"]
        persistent, walk = grid_choice(tuning, opts.window_right >= 0, varlen)
        if walk == "scheduled" and (num_tiles > MAX_SCHEDULED_ITEMS or
                                    q.is_cuda and torch.cuda.is_current_stream_capturing()):
            # the schedule's copy to the GPU cannot be captured, and its making takes about 0.7 s a million items:
            # such plans keep one program per item (docs/checks.md)
            persistent, walk = False, "sections"
        items = num_tiles
        ctas_per_sm = tuning["CTAS_PER_SM"]
        maxnreg = launch_maxnreg(consumers, ctas_per_sm, free_regs)
        if persistent:
            # CTAS_PER_SM programs per SM (one unless the tuning's shared memory allows two), each looping over items
            num_tiles = min(num_tiles,
                            ctas_per_sm * torch.cuda.get_device_properties(q.device).multi_processor_count)
        if l2_share and walk != "heads":
            # a query head's items stream K and V, shared by the heads of its GQA group
            section = l2_section(seqlen_k * head_dim * 2 * q.element_size() * nheads_k // nheads, q.device,
                                 l2_share)
        self.schedule = None
        if walk == "scheduled" and items:
            costs = causal_walk_costs(cdiv(seqlen_q, block_m), batch * nheads, section, seqlen_q, seqlen_k, opts,
                                      block_m, block_n, item_cost)
            table = decoded_schedule(schedule_items(costs, num_tiles), num_tiles, cdiv(seqlen_q, block_m),
                                     batch * nheads, section, nheads, reverse=True)  # REVERSE_M: causal
            self.schedule = torch.from_numpy(table).to(q.device)
        self.backward_plans: dict = {}
        # FP8 attention writes bf16, as FlashAttention-3's does
        self.dtype, self.device, self.out_shape = torch.bfloat16 if fp8 else q.dtype, q.device, (*q.shape[:-1],
                                                                                                  head_dim_v)
        self.lse_shape = (nheads, q.shape[0]) if varlen else (batch, nheads, seqlen_q)
        self.empty = q.numel() == 0 or batch * seqlen_q == 0
        qk_width = head_dim // qk_chunks  # Q and K tiles' columns (MLA: 64-column chunks)
        # a consumer partition's Q part (and O stage): WIDE's covers both warpgroups' rows
        self.q_block, self.kv_block = [1, block_m if wide else 64, 1, qk_width], [1, block_n, 1, qk_width]
        self.q_layout = shared_layout(self.q_block, q.dtype)
        self.kv_layout = shared_layout(self.kv_block, q.dtype)
        self.v_block, self.v_layout = self.kv_block, self.kv_layout
        self.mla = qk_chunks > 1  # O leaves through pointer stores
        if self.mla:
            self.v_block = [1, block_n, 1, head_dim_v]
            self.v_layout = shared_layout(self.v_block, q.dtype)
            tuning["QK_CHUNKS"] = qk_chunks
        self.v_transpose = False
        if fp8:
            if block_n % RELABEL_KEYS:
                raise ValueError(f"FP8 key tiles hold whole groups of {RELABEL_KEYS} relabelled keys: "
                                 f"BLOCK_N={block_n}")
            asked = v_transpose_asked(tuning, seqlen_q, nheads // nheads_k)
            self.v_transpose_declined = v_transpose_declines(tuning, v) if asked else "not asked"
            tuning["V_TRANSPOSE"] = self.v_transpose = self.v_transpose_declined is None
            if not self.v_transpose:  # (head_dim, BLOCK_N) tiles of the keys-last copy; else V's own, as K's
                self.v_block = [1, 1, head_dim, block_n]
                self.v_layout = shared_layout(self.v_block, q.dtype)
        named = dict(stride_o=row_strides(torch.empty(self.out_shape, device="meta"), varlen)[1:],
                     stride_lse=lse_strides(torch.empty(self.lse_shape, device="meta"), varlen), batch=batch,
                     nheads=nheads, group=nheads // nheads_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                     total_q=q.shape[0], total_k=k.shape[0], section=section, **opts.kernel_args())
        self.attend = Launch(
            attention_fwd_sm90_kernel, (max(num_tiles, 1), 1, 1), (),
            dict(named, REVERSE_M=named["HAS_RIGHT"], IS_FP8=fp8, **tuning),
            num_warps=4, num_stages=1, options=dict(maxnreg=maxnreg),
            compiling=free_registers if free_regs else None)

    def __call__(self, q, k, v, opts, descales=(None, None, None)):
        """descales: FP8's (q, k, v) factors, contiguous (batch, nheads_k) fp32."""
        out = common.empty(self.out_shape, self.dtype, self.device)
        lse = common.empty(self.lse_shape, torch.float32, self.device)
        if self.empty:
            return out, lse, None
        cu_q, cu_k, alibi, _ = opts.tensors()
        if self.fp8 and self.v_transpose:
            v_desc, o_desc = descriptor(v, self.v_block, self.v_layout), None  # transposed in the kernel
        elif self.fp8:
            # (batch, heads, head_dim, keys) with keys padded to and relabelled within 64s (_keep_p)
            vt = v_keys_last(v, multiple=RELABEL_KEYS, relabel=True)
            v_desc = descriptor(vt, self.v_block, self.v_layout)
            o_desc = None  # bf16 O leaves through pointer stores
        elif self.mla:
            v_desc, o_desc = descriptor(v, self.v_block, self.v_layout), None  # pointer stores
        else:
            v_desc = descriptor(v, self.v_block, self.v_layout)
            o_desc = descriptor(out, self.q_block, self.q_layout)
        self.attend(descriptor(q, self.q_block, self.q_layout),
                    descriptor(k, self.kv_block, self.kv_layout), v_desc, o_desc, out, lse, cu_q, cu_k,
                    alibi, *descales, self.schedule, opts.learnable_sink)
        return out, lse, None


# the block-sparse mode's list arguments (BlockLists)
SPARSE_LISTS = ("KvNum", "KvIndices", "PartialIds", "FullNum", "FullIndices", "MaskBits")


def compile_for_sm90(head_dim: int, dtype: torch.dtype = torch.bfloat16, score_mod=None, head_dim_v: int | None = None,
                     **flags: bool):
    """Compile one variant of the kernel for sm_90 without a GPU: CI catches a Gluon API change of a new
    Triton release this way. flags: the kernel's constexpr flags (HAS_LEFT, HAS_RIGHT, IS_VARLEN,
    HAS_SOFTCAP, HAS_ALIBI, REVERSE_M; False when left out), CONFIGS' tuning keys, SCHEDULED (a
    persistent causal grid's schedule table), SINK (learnable sinks), THREE_CONSUMERS (CONSUMERS=3) and
    BLOCK_SPARSE (a block mask's lists); score_mod: a score_mod.CompiledMod (with BLOCK_SPARSE). dtype
    torch.float8_e4m3fn compiles the FP8 variant; head_dim_v (unlike head_dim) the MLA variant of CONFIGS_MLA."""
    fp8 = dtype == torch.float8_e4m3fn
    mla = head_dim_v not in (None, head_dim)
    config = CONFIGS_MLA[(head_dim, head_dim_v)] if mla else (CONFIGS_FP8 if fp8 else CONFIGS)[head_dim]
    constants = dict(config, HAS_LEFT=False, HAS_RIGHT=False,
                     IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, REVERSE_M=False, IS_FP8=fp8, Schedule=None,
                     Sink=None)
    # tuning keys some launches leave out (V_TRANSPOSE: FP8's; the others off unless a tuning sets them), at
    # the kernel's defaults: a key missing here would compile as an int argument
    for key in ("V_TRANSPOSE", "FIRST_FULL", "WIDE", "IDLE_SKIP"):
        constants.setdefault(key, False)
    scheduled = flags.pop("SCHEDULED", False)
    sink = flags.pop("SINK", False)
    block_sparse = flags.pop("BLOCK_SPARSE", False)
    constants.update(SPARSE_Q=128, SPARSE_KV=128)
    if not block_sparse:
        constants.update(dict.fromkeys(SPARSE_LISTS + ("stride_num", "stride_idx")))
    if flags.pop("THREE_CONSUMERS", False):
        constants.update(CONSUMERS=3, PINGPONG=False)
    if scheduled:
        del constants["Schedule"]
    if sink:
        del constants["Sink"]
    constants.update(flags)
    block_n = constants["BLOCK_N"]
    free_regs = constants["FREE_REGS"]
    for key in HOST_TUNING_KEYS:  # launch-grid and compile choices, not kernel flags
        constants.pop(key, None)  # (V_TRANSPOSE_ROWS: FP8 tunings only)
    types = dict(Out="*bf16" if fp8 else "*DTYPE", Lse="*fp32", CuSeqlensQ="*i32", CuSeqlensK="*i32",
                 AlibiSlopes="*fp32", qk_scale="fp32", softcap_in2="fp32", softcap_out="fp32")
    if scheduled:
        types["Schedule"] = "*i64"
    if sink:
        types["Sink"] = "*fp32"
    if block_sparse:
        types.update(dict.fromkeys(SPARSE_LISTS, "*i32"))
    mod_signature(score_mod, constants, types)
    v_keys_last_tiles = fp8 and not constants.get("V_TRANSPOSE")
    q_rows = 64 * constants["CONSUMERS"] if constants.get("WIDE") else 64  # a consumer partition's Q part
    descriptors = dict(q_desc=q_rows, k_desc=block_n,
                       v_desc=[1, 1, head_dim, block_n] if v_keys_last_tiles else block_n)
    constants["QK_CHUNKS"] = head_dim // MLA_CHUNK if mla else 1  # a compile-only signature types the rest as int
    if mla:
        constants.update(o_desc=None, QDescale=None, KDescale=None, VDescale=None)
        descriptors = dict(q_desc=[1, 64, 1, MLA_CHUNK], k_desc=[1, block_n, 1, MLA_CHUNK],
                           v_desc=[1, block_n, 1, head_dim_v])
    elif fp8:
        types.update(QDescale="*fp32", KDescale="*fp32", VDescale="*fp32")
        constants["o_desc"] = None
    else:
        descriptors["o_desc"] = q_rows
        constants.update(QDescale=None, KDescale=None, VDescale=None)
    return compile_gluon(attention_fwd_sm90_kernel, dtype, head_dim, descriptors, types, constants,
                         launch_maxnreg(constants["CONSUMERS"], constants["CTAS_PER_SM"], free_regs), free_regs)
