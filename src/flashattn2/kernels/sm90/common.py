"""What the Hopper (sm_90) Gluon kernels share: wgmma's layouts, the reasons both decline a call, TMA
descriptors of the inputs, and their compile-only check for sm_90 (CI has no GPU)."""

import contextlib
import hashlib
import re

import torch
import triton

from .. import common
from ..common import runs_sm90a
from ..device.block_list import partial_visible, visit_block
from ..device.seqlen_info import sequence_bounds
from ..device.tile_order import ITEM_BITS, sectioned_item
from ..launch import Tiles
from ..tma import one_batch, tma_usable
from .gluon_api import TensorDescriptor, aggregate, gl, gluon, shared_layout

WG_M = gl.constexpr(64)  # rows per consumer warpgroup (wgmma's M)


@gluon.constexpr_function
def _value(x):
    # Triton passes an int argument equal to 1 (and None) as a plain Python value: keep it a constexpr
    return x if isinstance(x, (gl.tensor, gl.constexpr)) else gl.constexpr(x)


_SCALAR = (gl.tensor, gl.constexpr)


# a schedule item's fields (tile_order.decoded_schedule)
_ITEM_BITS = gl.constexpr(ITEM_BITS)
_ITEM_MASK = gl.constexpr((1 << ITEM_BITS) - 1)


@aggregate
class WorkGrid:
    """A launch's work items and what places one, as one argument of the kernels' partitions: `num_tiles`
    (block, batch x head) items of `num_blocks` blocks each, walked in sections of `section` heads
    (device/tile_order.py); `heads` per batch entry (the kv heads in the backward), `group` query heads per kv
    head; the sequences' lengths and bounds (packed batches: cu_seqlens) and the window; `schedule`: None (program i
    takes items i, i + grid, ...) or a host-made table of each program's items (forward.schedule_items): int64 with
    each item's place worked out (the forward; the backward with PLACED_SCHEDULE), int32 with its index. A new
    per-launch value is one field here and its use."""
    num_blocks: _SCALAR
    num_tiles: _SCALAR
    section: _SCALAR
    heads: _SCALAR
    group: _SCALAR
    cu_seqlens_q: _SCALAR
    cu_seqlens_k: _SCALAR
    seqlen_q: _SCALAR
    seqlen_k: _SCALAR
    total_q: _SCALAR
    total_k: _SCALAR
    window_left: _SCALAR
    window_right: _SCALAR
    schedule: _SCALAR
    scheduled: gl.constexpr
    decoded: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, num_blocks, num_tiles, section, heads, group, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k,
                 total_q, total_k, window_left, window_right, schedule=None):
        self.num_blocks = _value(num_blocks)
        self.num_tiles = _value(num_tiles)
        self.section = _value(section)
        self.heads = _value(heads)
        self.group = _value(group)
        self.cu_seqlens_q = _value(cu_seqlens_q)
        self.cu_seqlens_k = _value(cu_seqlens_k)
        self.seqlen_q = _value(seqlen_q)
        self.seqlen_k = _value(seqlen_k)
        self.total_q = _value(total_q)
        self.total_k = _value(total_k)
        self.window_left = _value(window_left)
        self.window_right = _value(window_right)
        self.schedule = _value(schedule)
        self.scheduled = gl.constexpr(not (isinstance(self.schedule, gl.constexpr) and self.schedule.value is None))
        # an int64 table holds each item's place worked out (tile_order.decoded_schedule), an int32 one its index
        self.decoded = gl.constexpr(self.scheduled and self.schedule.dtype.element_ty == gl.int64)

    @gluon.jit
    def steps(self):
        """This program's loop over its items, as range() bounds: items i, i + grid, ... without a schedule;
        with one, its row of the table (CSR: programs + 1 offsets, then the items)."""
        pid = gl.program_id(0)
        if self.scheduled:
            return gl.load(self.schedule + pid).to(gl.int32), gl.load(self.schedule + pid + 1).to(gl.int32), 1
        else:
            return pid, self.num_tiles, gl.num_programs(0)

    @gluon.jit
    def item(self, tile, BLOCK: gl.constexpr, REVERSE: gl.constexpr, IS_VARLEN: gl.constexpr):
        """Work item `tile` (a loop step of steps()) as (its block's first row, batch, head, first q row, seqlen_q,
        first k row, seqlen_k): its place in the sectioned walk (REVERSE: the last blocks first, where they are the
        longest), which a schedule holds worked out (tile_order.decoded_schedule), and its sequence's bounds."""
        if self.decoded:
            placed = gl.load(self.schedule + gl.num_programs(0) + 1 + tile)  # tile_order.decoded_schedule's fields
            start = (placed & _ITEM_MASK).to(gl.int32) * BLOCK
            off_b = ((placed >> _ITEM_BITS) & _ITEM_MASK).to(gl.int32)
            off_h = (placed >> 2 * _ITEM_BITS).to(gl.int32)
        else:
            if self.scheduled:
                tile = gl.load(self.schedule + gl.num_programs(0) + 1 + tile)
            num_bh = self.num_tiles // self.num_blocks
            block, pid_bh = sectioned_item(tile, self.num_blocks, num_bh, self.section)
            if REVERSE:
                block = self.num_blocks - 1 - block
            start = block * BLOCK
            off_b = pid_bh // self.heads
            off_h = pid_bh % self.heads
        q_start, seqlen_q, k_start, seqlen_k = sequence_bounds(off_b, self.cu_seqlens_q, self.cu_seqlens_k,
                                                               self.seqlen_q, self.seqlen_k, self.total_q,
                                                               self.total_k, IS_VARLEN)
        return start, off_b, off_h, q_start, seqlen_q, k_start, seqlen_k


@aggregate
class BlockLists:
    """A block mask's visit lists (device/block_list.py) for the Gluon kernels' block-sparse mode, as one argument
    of their partitions. The forward's work items are query blocks visiting key blocks (the mask's kv view); the
    backward's (BY_KEY) key blocks visiting query blocks (its q view). Per (batch, query head, item block): the
    partial blocks' count (num), indices and rows in the mask bits (ids), and the full blocks' count and
    indices; the counts' (batch, head) strides and the lists' (batch, head, item block) strides, each pair shared
    by partial and full lists. `on` is False (every field None) in calls without a block mask."""
    num: _SCALAR
    indices: _SCALAR
    ids: _SCALAR
    full_num: _SCALAR
    full_indices: _SCALAR
    bits: _SCALAR
    num_sb: _SCALAR
    num_sh: _SCALAR
    idx_sb: _SCALAR
    idx_sh: _SCALAR
    idx_sq: _SCALAR
    sparse_q: gl.constexpr
    sparse_kv: gl.constexpr
    by_key: gl.constexpr
    item_block: gl.constexpr
    visit_block: gl.constexpr
    on: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, num, indices, ids, full_num, full_indices, bits, num_sb, num_sh, idx_sb, idx_sh, idx_sq,
                 sparse_q, sparse_kv, by_key=False):
        self.num = _value(num)
        self.indices = _value(indices)
        self.ids = _value(ids)
        self.full_num = _value(full_num)
        self.full_indices = _value(full_indices)
        self.bits = _value(bits)
        self.num_sb = _value(num_sb)
        self.num_sh = _value(num_sh)
        self.idx_sb = _value(idx_sb)
        self.idx_sh = _value(idx_sh)
        self.idx_sq = _value(idx_sq)
        self.sparse_q = gl.constexpr(sparse_q)
        self.sparse_kv = gl.constexpr(sparse_kv)
        self.by_key = gl.constexpr(by_key)
        self.item_block = gl.constexpr(sparse_kv if by_key else sparse_q)
        self.visit_block = gl.constexpr(sparse_q if by_key else sparse_kv)
        self.on = gl.constexpr(not (isinstance(self.num, gl.constexpr) and self.num.value is None))

    @gluon.jit
    def visit(self, off_b, off_h, start, STEP: gl.constexpr):
        """A work item's visit (its rows from `start`, query head off_h): ((its lists' offset, its partial
        blocks' tiles, its mask block's first row), the tiles of STEP rows it visits, partial ones first)."""
        SUBS: gl.constexpr = self.visit_block // STEP
        block = start // self.item_block
        row = off_b.to(gl.int64) * self.num_sb + off_h.to(gl.int64) * self.num_sh + block
        lists = off_b.to(gl.int64) * self.idx_sb + off_h.to(gl.int64) * self.idx_sh + block * self.idx_sq
        n_partial = gl.load(self.num + row)
        tiles = (n_partial + gl.load(self.full_num + row)) * SUBS
        return (lists, n_partial * SUBS, block * self.item_block), tiles

    @gluon.jit
    def ranges(self, off_b, off_h, start, STEP: gl.constexpr):
        """The dense kernels' (lo, full_lo, full_hi, hi) visit "ranges" of a work item, counted in visit tiles STEP
        apart (the partial blocks' tiles, masked, then the full ones), and its visit."""
        visit, tiles = self.visit(off_b, off_h, start, STEP)
        return 0, visit[1] * STEP, tiles * STEP, tiles * STEP, visit

    @gluon.jit
    def tile_start(self, visit, tile, STEP: gl.constexpr):
        """The first row (key in the forward, query in the backward) of visit tile `tile`."""
        SUBS: gl.constexpr = self.visit_block // STEP
        lists, partial_tiles, _ = visit
        block = visit_block(self.indices + lists, self.full_indices + lists, tile // SUBS, partial_tiles // SUBS)
        return block * self.visit_block + (tile % SUBS) * STEP

    @gluon.jit
    def mask(self, s, visit, tile, offs_item, STEP: gl.constexpr, COL0: gl.constexpr = 0):
        """Scores s of visit tile `tile` (rows: the item's offs_item; columns: the tile's from COL0), -inf where a
        partial block's bits hide the pair."""
        SUBS: gl.constexpr = self.visit_block // STEP
        lists, partial_tiles, block_row = visit
        if tile < partial_tiles:
            cols = (tile % SUBS) * STEP + COL0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
            visible = partial_visible(self.bits, gl.load(self.ids + lists + tile // SUBS), offs_item - block_row,
                                      cols, self.sparse_q, self.sparse_kv, self.by_key)
            s = gl.where(visible, s, float("-inf"))
        return s


@aggregate
class ScoreMod:
    """FlexAttention's score_mod in the Gluon kernels (flex calls only): score_mod.compile_score_mod's @triton.jit
    functions (`fn`, its derivative `grad`), their captured tensors' pointers, the softmax scale the mod's input
    carries, and the (batch, query head) of the scores at hand (`at` sets them per work item / head). `on` is
    False (fn None) in every other call, where nothing here is traced."""
    fn: gl.constexpr
    grad: gl.constexpr
    captures: (gl.tuple, gl.constexpr)
    scale: _SCALAR
    off_b: _SCALAR
    off_h: _SCALAR
    on: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, fn, grad, captures, scale, off_b=0, off_h=0):
        self.fn = gl.constexpr(fn)
        self.grad = gl.constexpr(grad)
        self.captures = captures if isinstance(captures, gl.tuple) else _value(captures)
        self.scale = _value(scale)
        self.off_b = _value(off_b)
        self.off_h = _value(off_h)
        self.on = gl.constexpr(self.fn.value is not None)

    @gluon.jit
    def at(self, off_b, off_h):
        """This mod for the scores of sequence off_b, query head off_h."""
        return ScoreMod(self.fn, self.grad, self.captures, self.scale, off_b, off_h)

    @gluon.jit
    def scores(self, s, q_idx, k_idx):
        """Raw q.k scores -> score_mod(q.k scale, b, h, q_idx, k_idx) in natural units (the caller's qk_scale is
        log2(e)); unchanged when off. q_idx and k_idx come pre-broadcast, either way round."""
        if self.on:
            s = self.fn(s * self.scale, self.off_b, self.off_h, q_idx, k_idx, self.captures)
        return s

    @gluon.jit
    def derivative(self, s, q_idx, k_idx):
        """d score_mod / d score at raw q.k scores s (dS's factor in the backward): 1.0 when off."""
        d = 1.0
        if self.on:
            d = self.grad(s * self.scale, self.off_b, self.off_h, q_idx, k_idx, self.captures)
        return d


@gluon.jit
def ready_phase(count, SLOTS: gl.constexpr):
    """The phase to wait for on the "full" barrier of use `count` of a ring of SLOTS buffers (an mbarrier's phase
    flips each time the ring comes round)."""
    return (count // SLOTS) & 1


@gluon.jit
def free_phase(count, SLOTS: gl.constexpr):
    """The phase a producer waits for on the "empty" barrier before filling use `count`: the one before
    ready_phase's, which a fresh barrier counts as completed, so that the first round does not wait."""
    return ready_phase(count, SLOTS) ^ 1


@gluon.constexpr_function
def wgmma_layout(n, bits=16, warps=4):
    # wgmma's accumulator for a 64 x n tile of one warpgroup (K per instruction: 256 bits of inputs); 8 warps: a
    # 128 x n tile of two warpgroups, 64 rows each
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, n, 256 // bits])


@gluon.constexpr_function
def p_layout(block_d, bits=16, warps=4):
    # P as the register A operand of O += P V (32 bits of K per register)
    return gl.DotOperandLayout(operand_index=0, parent=wgmma_layout(block_d, bits, warps), k_width=32 // bits)


@gluon.jit
def to_half2(x, dtype: gl.constexpr):
    """fp32 x -> dtype (bf16 / fp16) two elements a conversion (cvt.rn.*x2): from scalar conversions ptxas packed
    P's pairs the wrong way round and swapped every register back (PRMT), 32 a 64 x 128 tile."""
    if dtype == gl.bfloat16:
        y = gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.bfloat16,
                                      is_pure=True, pack=2)
    else:
        y = gl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.float16,
                                      is_pure=True, pack=2)
    return y


def sm90_declines(q: torch.Tensor, head_dims, kernel: str, dropout: bool, *tensors: torch.Tensor,
                  dtypes=(torch.float16, torch.bfloat16), unlike_v: int = 0) -> str | None:
    """What keeps a call off a Gluon kernel (sm90.forward's or sm90.backward's) for reasons both share, or None.
    unlike_v: the caller takes a value head dim unlike the query's, that of the last unlike_v tensors."""
    if any(t.numel() == 0 for t in (q, *tensors)):  # the portable kernels answer empty calls without a launch
        return "an empty tensor (no query rows or no keys: a descriptor needs a non-empty tensor)"
    if common.INTERPRET:
        return "the Triton interpreter cannot run Gluon"
    if not runs_sm90a(q):
        return "not an sm_90 (Hopper) GPU"
    if q.dtype not in dtypes:
        return f"dtype {q.dtype}"
    if q.shape[-1] not in head_dims:
        return f"head dim {q.shape[-1]} (the Gluon {kernel} has {sorted(head_dims)})"
    if any(t.shape[-1] != q.shape[-1] for t in tensors[:len(tensors) - unlike_v]):
        return "a value head dim unlike the query's (MLA)"
    if dropout:
        return "dropout"
    if not tma_usable(q, *tensors):
        return "a stride or base address that TMA cannot read (16-byte alignment, unit last stride)"
    if common.long_rows(1 if q.dim() == 4 else 0, q, *tensors):
        return "row offsets past 2**31 elements inside a sequence (the Triton kernels take them in 64 bits)"
    return None


def descriptor(x: torch.Tensor, block: list[int], layout) -> Tiles:
    """A TMA descriptor handing out `block` tiles of x, as a Launch argument (launch.Tiles: encoded once per address):
    4-D (batch, rows, heads, head_dim); a packed batch (total, heads, head_dim) is one (1, total, heads, head_dim) view
    (tma.one_batch)."""
    return Tiles(one_batch(x), block, layout, TensorDescriptor)


# the Gluon kernels' tuple arguments: (row, head) strides of O, (batch, head) of the row statistics, (batch, row,
# head) of the packed dK / dV
TUPLE_STRIDES = {"stride_o": 2, "stride_lse": 2, "stride_dk": 3, "stride_dv": 3, "stride_num": 2, "stride_idx": 3}


_POINTER_TYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int32: "*i32",
                  torch.int64: "*i64", torch.int16: "*i16", torch.int8: "*i8", torch.uint8: "*u8", torch.bool: "*i1"}


def mod_signature(mod, constants: dict, types: dict) -> None:
    """A compile-only signature's score_mod arguments (ScoreMod): none (mod None) or a CompiledMod's functions and
    its captured tensors' pointer types."""
    constants.update(MOD_FN=None if mod is None else mod.fn, MOD_GRAD=None if mod is None else mod.grad)
    if mod is None:
        constants["captures"] = None
    else:
        types["captures"] = tuple(_POINTER_TYPES[t.dtype] for t in mod.captures)
    types["mod_scale"] = "fp32"


def compile_gluon(kernel, dtype: torch.dtype, head_dim: int, descriptors: dict[str, int], types: dict[str, str],
                  constants: dict, maxnreg: int, free_regs: bool = False):
    """Compile a Gluon kernel of these modules for sm_90 without a GPU (`triton.compile` with a CUDA target).
    descriptors: descriptor argument -> tile rows (or the whole block); types: the other non-int32 arguments'
    types (DTYPE: the inputs' type); free_regs: compile under free_registers, as the launch does."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    type_name = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8e4nv"}[dtype]
    for name, rows in descriptors.items():
        block = rows if isinstance(rows, list) else [1, rows, 1, head_dim]
        layout = shared_layout(block, dtype)
        types[name] = f"tensordesc<{type_name}[{','.join(map(str, block))}],{layout!r}>"
    types = {name: t if isinstance(t, tuple) else t.replace("DTYPE", type_name) for name, t in types.items()}
    names = kernel.arg_names
    # stride_* arguments not typed otherwise are int32 tuples of the length their TUPLE_STRIDES entry gives
    signature = {n: "constexpr" if n in constants else types.get(n, ("i32",) * TUPLE_STRIDES[n] if n in TUPLE_STRIDES
                                                                   else "i32") for n in names}
    source = GluonASTSource(kernel, signature, {(names.index(n),): value for n, value in constants.items()})
    with free_registers() if free_regs else contextlib.nullcontext():
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, maxnreg=maxnreg))


# ptxas allocates registers within PTX's `.maxnreg` everywhere, setmaxnreg regions included; without it (the launch
# still bounded by `.reqntid`) each warp-specialised partition gets what its setmaxnreg grants, as CUDA's
# warp-specialised kernels do. Triton always writes `.maxnreg` (the launch's cap), so free_registers drops it.
_MAXNREG_LINE = re.compile(r"^[ \t]*\.maxnreg[ \t]+\d+[ \t]*\n", re.MULTILINE)
_FREE_REGS_KEY = "flashattn2-free-registers-v1"


def strip_maxnreg(ptx: str) -> str:
    """PTX without its `.maxnreg` directive, for kernels that move registers with setmaxnreg (else unchanged)."""
    if "setmaxnreg" not in ptx or ".reqntid" not in ptx:
        return ptx
    return _MAXNREG_LINE.sub("", ptx)


@contextlib.contextmanager
def free_registers():
    """While a Gluon kernel compiles (Launch's first call, compile_gluon): its PTX loses `.maxnreg`, so that ptxas
    sizes each partition by its setmaxnreg (the three-consumer d64 forward: no spills at 160 registers, where the
    launch's cap of 128 spilled). Triton's stage hook is set only for the compile and put back after; from triton
    3.7 the hook's key joins the cache key, so a kernel compiled under it is cached apart."""
    runtime = triton.knobs.runtime
    previous = runtime.add_stages_inspection_hook

    def hook(*args):
        if not args:  # triton >= 3.7 asks for a cache key first
            key = _FREE_REGS_KEY
            if previous is not None:
                key = previous()[0] + key
            return key, hashlib.sha256(key.encode()).hexdigest()
        if previous is not None:
            previous(*args)
        stages = args[1]
        make_ptx = stages["ptx"]
        stages["ptx"] = lambda src, metadata: strip_maxnreg(make_ptx(src, metadata))

    runtime.add_stages_inspection_hook = hook
    try:
        yield
    finally:
        runtime.add_stages_inspection_hook = previous
