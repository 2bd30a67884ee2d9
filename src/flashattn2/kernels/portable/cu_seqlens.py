"""The values of cu_seqlens, judged on the GPU without a device-to-host sync.

Reading them on the host would stall every call until the GPU caught up. Instead:
1. the attention kernels clamp every sequence to the rows of q and k and to max_seqlen
   (seqlen_info.sequence_bounds), so no value can move a load or store out of the tensors;
2. after them, check_and_poison launches one small kernel that checks the values (start at 0, never
   decrease, end at the number of rows, no sequence longer than max_seqlen) and, if any check fails,
   fills the call's outputs with NaN and writes what failed into a per-device word of pinned host
   memory;
3. the next varlen call or backward on that device reads the word (a plain host read, no sync) and
   raises a ValueError that names the problem. FLASHATTN2_SYNC_CHECKS=1 waits for the check instead,
   so the bad call itself raises (one sync per call).
"""

import os

import torch
import triton
import triton.language as tl

from ..common import INTERPRET, cdiv
from ..launch import Launch, PlanCache, align

SYNC_CHECKS: bool = os.environ.get("FLASHATTN2_SYNC_CHECKS", "0") == "1"

_FILL_PROGRAMS = 64
_FILL_BLOCK = 1024
_BATCH_BLOCK = 128
# The flag has a word per kind of check: cu_seqlens here, the KV-cache tables in kvcache.py
CU_SEQLENS_WORD = 0
KVCACHE_WORD: tl.constexpr = tl.constexpr(1)
# bit i of the KV-cache word: the check that failed (kvcache.cache_sequence sets bits 0-3, a page index bit 4)
KVCACHE_CHECKS = ("cache_seqlens below 0", "cache_seqlens + seqlen_new past the cache capacity",
                  "cache_leftpad below 0 or above cache_seqlens", "cache_batch_idx outside the cache's rows",
                  "block_table entry outside [0, num_blocks)")
# bit i of a tensor's 4-bit group: the check that failed; k's group sits 4 bits above q's
_CHECKS = ("must start at 0", "must not decrease", "must end at the number of rows of {x}",
           "has a sequence longer than max_seqlen_{x}")


@triton.jit
def _failed_checks(Cu, batch, total, max_seqlen, BLOCK: tl.constexpr):
    """Bit mask of the failed checks of one cu_seqlens (see _CHECKS)."""
    bits = tl.full([], 0, tl.int32)
    for start in range(0, batch + 1, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs <= batch
        has_prev = inside & (offs > 0)
        cur = tl.load(Cu + offs, mask=inside, other=0).to(tl.int64)
        length = cur - tl.load(Cu + offs - 1, mask=has_prev, other=0).to(tl.int64)
        bits |= tl.max(((offs == 0) & (cur != 0)).to(tl.int32), 0)
        bits |= tl.max((has_prev & (length < 0)).to(tl.int32), 0) << 1
        bits |= tl.max(((offs == batch) & (cur != total)).to(tl.int32), 0) << 2
        bits |= tl.max((has_prev & (length > max_seqlen)).to(tl.int32), 0) << 3
    return bits


@triton.jit
def _fill_nan(X, n_blocks, n, BLOCK: tl.constexpr):
    for i in range(tl.program_id(0), n_blocks, tl.num_programs(0)):
        # 64-bit: the flat index can pass 2**31
        offs = (tl.full([], 0, tl.int64) + i) * BLOCK + tl.arange(0, BLOCK)
        tl.store(X + offs, tl.full([BLOCK], float("nan"), X.dtype.element_ty), mask=offs < n)


@triton.jit
def check_and_poison_kernel(CuSeqlensQ, CuSeqlensK, Flag, A, B, C, blocks_a, blocks_b, blocks_c, n_a, n_b, n_c,
                            batch, total_q, total_k, max_seqlen_q, max_seqlen_k,
                            BATCH_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    bits = _failed_checks(CuSeqlensQ, batch, total_q, max_seqlen_q, BATCH_BLOCK)
    bits |= _failed_checks(CuSeqlensK, batch, total_k, max_seqlen_k, BATCH_BLOCK) << 4
    if bits != 0:
        if tl.program_id(0) == 0:
            tl.store(Flag, bits)  # word 0 (CU_SEQLENS_WORD)
        _fill_nan(A, blocks_a, n_a, BLOCK)
        _fill_nan(B, blocks_b, n_b, BLOCK)
        _fill_nan(C, blocks_c, n_c, BLOCK)


class _Flag:
    """Int32 words of pinned host memory per device: the GPU writes them, the host reads them for free."""

    def __init__(self, device: torch.device) -> None:
        # pinned memory is mapped into the GPU's address space (unified addressing)
        self.tensor = torch.zeros(2, dtype=torch.int32, pin_memory=device.type == "cuda")
        self.view = self.tensor.numpy()


_flags: dict[int, _Flag] = {}


def flag(device: torch.device) -> torch.Tensor:
    """The device's flag words, for the kernels that report failed checks."""
    return _flag(device).tensor


def _flag(device: torch.device) -> _Flag:
    index = -1 if device.type == "cpu" else device.index
    flag = _flags.get(index)
    if flag is None:
        flag = _flags[index] = _Flag(device)
    return flag


def describe(bits: int) -> str:
    """The failed checks in words."""
    parts = []
    for x, shift in (("q", 0), ("k", 4)):
        failed = [check.format(x=x) for i, check in enumerate(_CHECKS) if bits >> (shift + i) & 1]
        if failed:
            parts.append(f"cu_seqlens_{x} " + ", ".join(failed))
    return "; ".join(parts)


def raise_pending(device: torch.device) -> None:
    """Raise for bad cu_seqlens or KV-cache tables that an earlier call on this device left in the flag,
    then clear it."""
    flag = _flags.get(-1 if device.type == "cpu" else device.index)
    if flag is None or not (flag.view[0] or flag.view[1]):
        return
    bits, cache_bits = int(flag.view[CU_SEQLENS_WORD]), int(flag.view[KVCACHE_WORD.value])
    flag.view[:] = 0
    if cache_bits:
        failed = ", ".join(check for i, check in enumerate(KVCACHE_CHECKS) if cache_bits >> i & 1)
        raise ValueError(
            f"invalid KV-cache tables given to flash_attn_with_kvcache (or a paged flash_attn_varlen_func) on "
            f"{device}: {failed}. The values are checked on the GPU, without a sync, so this may be reported by "
            f"a later call; the sequences that failed read and wrote nothing and their outputs were set to NaN "
            f"(FLASHATTN2_SYNC_CHECKS=1 makes that call raise instead)")
    raise ValueError(
        f"invalid cumulative sequence lengths given to a flash_attn_varlen_* call on {device}: "
        f"{describe(bits)}. They must start at 0, not decrease, end at the number of rows of q / k, and no "
        f"sequence may be longer than max_seqlen. The values are checked on the GPU after the kernels, "
        f"without a sync, so this may be reported by a later call; the outputs of the call with the bad "
        f"values were set to NaN (FLASHATTN2_SYNC_CHECKS=1 makes that call raise instead)")


_plans = PlanCache()
_spare: dict[torch.device, torch.Tensor] = {}


def poison_targets(outputs: tuple[torch.Tensor, ...], device: torch.device) -> tuple[list[torch.Tensor], list[int]]:
    """The three buffers check_and_poison's kernel takes and how many elements of each it fills: the first three
    non-empty outputs, then the first again with nothing to fill (when every output is empty, a spare float buffer:
    the kernel's NaN fill compiles for float types only)."""
    outs = [x for x in outputs if x is not None and x.numel() > 0][:3]
    sizes = [x.numel() for x in outs] + [0] * (3 - len(outs))
    if not outs:
        spare = _spare.get(device)
        if spare is None:
            spare = _spare[device] = torch.empty(1, dtype=torch.float32, device=device)
        outs = [spare]
    return outs + [outs[0]] * (3 - len(outs)), sizes


def check_and_poison(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int,
                     max_seqlen_q: int, max_seqlen_k: int, outputs: tuple[torch.Tensor, ...]) -> None:
    """Launch the check of one call's cumulative lengths; NaN-fill up to three outputs if it fails."""
    device = cu_seqlens_q.device
    flag = _flag(device)
    outs, sizes = poison_targets(outputs, device)
    key = (cu_seqlens_q.shape, total_q, total_k, max_seqlen_q, max_seqlen_k, *sizes, *[x.dtype for x in outs],
           align(cu_seqlens_q), align(cu_seqlens_k), *[align(x) for x in outs])
    check = _plans.get(key)
    if check is None:
        for x in outs:
            assert x.is_contiguous(), "outputs to poison are allocated contiguous"
        check = _plans.add(key, Launch(
            check_and_poison_kernel, (_FILL_PROGRAMS, 1, 1),
            (*[cdiv(n, _FILL_BLOCK) for n in sizes], *sizes, cu_seqlens_q.shape[0] - 1, total_q, total_k,
             max_seqlen_q, max_seqlen_k),
            dict(BATCH_BLOCK=32 if INTERPRET else _BATCH_BLOCK, BLOCK=_FILL_BLOCK), 4, 1))
    check(cu_seqlens_q, cu_seqlens_k, flag.tensor, *outs)
    if SYNC_CHECKS and device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    raise_pending(device)
