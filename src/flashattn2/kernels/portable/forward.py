"""FlashAttention-2 forward: one program per (query tile, batch x head), looping over key tiles."""

import torch
import triton
import triton.language as tl

from .. import common
from ..common import INTERPRET, LOG2E, cdiv, load_rows, long_rows, mma, padded_head_dim, round_to, store_rows
from ..device.block_range import kv_range_for_q_tile
from ..device.dropout import dropout_keep
from ..device.mask import score_mask
from ..device.scores import alibi_slope_of, fp8_scales, masked_scores, transformed_scores
from ..device.seqlen_info import ROW_COUNTS, program_problem, sequence_bounds
from ..device.softmax import finalize, online_softmax_update
from ..device.tma import load_tile
from ..launch import Launch, PlanCache, align
from ..params import AttnOptions, lse_strides, problem_dims, row_strides
from ..tma import row_tiles, tma_usable
from .configs import FwdConfig, fwd_config
from .v_layout import keys_last, keys_last_layout


@triton.jit
def _attend_kv_tiles(acc, m_i, l_i, q, k_src, v_src, off_b, off_hk, stride_kn, stride_vn, offs_m, offs_d,
                     n_lo, n_hi, seqlen_q, seqlen_k, qk_scale, window_left, window_right,
                     softcap_in2, softcap_out, alibi_slope, seed, head_idx, dropout_p,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                     HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                     HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, MASKED: tl.constexpr,
                     USE_TMA: tl.constexpr, INTERPRET: tl.constexpr, P_SHIFT: tl.constexpr, V_T: tl.constexpr,
                     stride_vd, offs_dv, DV: tl.constexpr, BDV: tl.constexpr, MASK_FROM: tl.constexpr = False,
                     mask_from=0):
    """Accumulate key tiles [n_lo, n_hi) into (acc, m_i, l_i); MASKED tiles check bounds and the window. V's
    head dim is DV (padded BDV; offs_dv), the same as q's and k's but for MLA-style calls. MASK_FROM (ONE_LOOP):
    every tile checks bounds, and those from mask_from on take the window's mask through a branch the whole program
    takes alike."""
    CHECKED: tl.constexpr = MASKED or MASK_FROM
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(n_lo, n_hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = load_tile(k_src, off_b, off_hk, start_n, offs_n, seqlen_k, stride_kn, offs_d, HEAD_DIM, BLOCK_D,
                      BLOCK_N, CHECKED, USE_TMA)
        qk, softmax_scale_log2, _tanh = masked_scores(
            q, k, offs_m[:, None], offs_n[None, :], seqlen_q, seqlen_k, qk_scale, window_left, window_right,
            softcap_in2, softcap_out, alibi_slope, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, MASKED, INTERPRET)
        if MASK_FROM:
            if start_n >= mask_from:
                visible = score_mask(offs_m[:, None], offs_n[None, :], seqlen_q, seqlen_k, window_left,
                                     window_right, HAS_LEFT, HAS_RIGHT)
                qk = tl.where(visible, qk, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_update(qk, m_i, l_i, softmax_scale_log2, CHECKED, P_SHIFT)
        if V_T:
            # V stored seqlen-contiguous: the tile is K-major for the P V matmul, as FP8 tensor cores need
            v = load_rows(v_src + offs_n[:, None] + offs_dv[None, :] * stride_vd, offs_n, seqlen_k, offs_dv, DV,
                          BDV, CHECKED)
        else:
            v = load_tile(v_src, off_b, off_hk, start_n, offs_n, seqlen_k, stride_vn, offs_dv, DV, BDV,
                          BLOCK_N, CHECKED, USE_TMA)
        if HAS_DROPOUT:
            # the row sum keeps every probability; only the values that reach V are dropped
            p = tl.where(dropout_keep(seed, offs_m[:, None], offs_n[None, :], head_idx, dropout_p), p, 0.0)
        acc = mma(round_to(p, v.dtype, INTERPRET), v, acc * alpha[:, None], INTERPRET)
    return acc, m_i, l_i


@triton.jit(do_not_specialize=ROW_COUNTS)
def attention_fwd_kernel(
    Q, K, V, Out, Lse, CuSeqlensQ, CuSeqlensK, AlibiSlopes, Seed, QDescale, KDescale, VDescale, Sink,
    stride_q, stride_k, stride_v, stride_o, stride_lse, stride_alibi_b,
    nheads, group, seqlen_q, seqlen_k, total_q, total_k, qk_scale, window_left, window_right, softcap_in2,
    softcap_out, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, USE_TMA: tl.constexpr, INTERPRET: tl.constexpr,
    LONG_ROWS: tl.constexpr = False, IS_FP8: tl.constexpr = False, V_T: tl.constexpr = False, stride_vd=1,
    HEAD_DIM_V: tl.constexpr = 0, BLOCK_DV: tl.constexpr = 0, ONE_LOOP: tl.constexpr = False,
):
    """Out = softmax(scores) V and Lse = logsumexp(scores) (natural log), scores = Q K^T * scale with
    the optional softcap, ALiBi bias and window mask; dropout on the probabilities that reach V.

    IS_FP8: Q, K, V are float8 e4m3 whose true values are theirs times the (batch, kv head) factors in
    QDescale, KDescale, VDescale (contiguous (batch, nheads_k) fp32); P goes to V in e4m3 too.
    V_T: V has a unit row stride and stride_vd between head-dim elements (v_layout.keys_last).
    Sink: None, or (nheads,) learnable sinks (float32 or the inputs' dtype), one more logit of each row with no
    value: Out and Lse come with it (sinks.py).

    qk_scale is softmax_scale * log2(e). Q, K, V, Out are (batch, seqlen, heads, head_dim) with any
    strides but a unit last one, or packed (total, heads, head_dim) with cumulative lengths (varlen).
    GQA: query head h reads key head h // group. With USE_TMA, K and V are row_tiles descriptors.
    stride_q, _k, _v, _o: (batch, row, head) strides (params.row_strides); stride_lse: (batch, head).
    HEAD_DIM_V / BLOCK_DV: V's and Out's head dim where it differs from Q's and K's (MLA; 0: the same).
    ONE_LOOP (without a left window edge): the key tiles as one loop, the masked ones by a branch.
    """
    DV: tl.constexpr = HEAD_DIM_V if HEAD_DIM_V > 0 else HEAD_DIM
    BDV: tl.constexpr = BLOCK_DV if BLOCK_DV > 0 else BLOCK_D
    stride_qb, stride_qm, stride_qh = stride_q
    stride_kb, stride_kn, stride_kh = stride_k
    stride_vb, stride_vn, stride_vh = stride_v
    stride_ob, stride_om, stride_oh = stride_o
    stride_lse_b, stride_lse_h = stride_lse
    if LONG_ROWS:
        # row index x row stride can pass 2**31 inside one sequence: 64-bit strides widen every row offset
        stride_qm, stride_kn, stride_vn, stride_om = (stride_qm.to(tl.int64), stride_kn.to(tl.int64),
                                                      stride_vn.to(tl.int64), stride_om.to(tl.int64))
        if V_T:
            stride_vd = stride_vd.to(tl.int64)
    start_m, off_b, off_h, q_start, seqlen_q, k_start, seqlen_k = program_problem(
        nheads, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k, total_q, total_k, BLOCK_M, IS_VARLEN)
    if start_m >= seqlen_q:
        return  # a packed sequence shorter than the longest one
    pid_bh = tl.program_id(1)  # the (batch, head) index that picks the dropout stream
    off_b64 = off_b.to(tl.int64)
    off_hk = off_h // group

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BDV)
    q_base = Q + off_b64 * stride_qb + q_start.to(tl.int64) * stride_qm + off_h.to(tl.int64) * stride_qh
    if USE_TMA:
        k_src = K
        v_src = V
    else:
        k_src = K + off_b64 * stride_kb + k_start.to(tl.int64) * stride_kn + off_hk.to(tl.int64) * stride_kh
        v_src = V + off_b64 * stride_vb + k_start.to(tl.int64) * stride_vn + off_hk.to(tl.int64) * stride_vh
    q = load_rows(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], offs_m, seqlen_q, offs_d,
                  HEAD_DIM, BLOCK_D, True)
    alibi_slope = alibi_slope_of(AlibiSlopes, off_b, off_h, stride_alibi_b, HAS_ALIBI)
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(Seed)
    v_descale = 1.0
    P_SHIFT: tl.constexpr = 8.0 if IS_FP8 else 0.0
    if IS_FP8:
        qk_scale, softcap_in2, v_descale = fp8_scales(QDescale, KDescale, VDescale, off_b, off_hk, nheads // group,
                                                      qk_scale, softcap_in2)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BDV], dtype=tl.float32)

    n_lo, n_full_lo, n_full_hi, n_hi = kv_range_for_q_tile(start_m, seqlen_q, seqlen_k, window_left,
                                                           window_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    # tiles cut by the window's left edge (masked; the range is empty without one), tiles that every row sees
    # whole (no mask arithmetic at all), tiles crossed by the diagonal (the window's right edge) or by the end
    # of the keys (masked)
    bounds = (n_lo, n_full_lo, n_full_hi, n_hi)
    # ONE_LOOP (no left edge): [n_lo, n_hi) as one loop, the tiles from n_full_hi on masked by a branch
    one_loop: tl.constexpr = ONE_LOOP and not HAS_LEFT
    for r in tl.static_range(3):
        if (r == 1) if one_loop else (r != 0 or HAS_LEFT):
            acc, m_i, l_i = _attend_kv_tiles(
                acc, m_i, l_i, q, k_src, v_src, off_b, off_hk, stride_kn, stride_vn, offs_m, offs_d,
                n_lo if one_loop else bounds[r], n_hi if one_loop else bounds[r + 1], seqlen_q, seqlen_k, qk_scale,
                window_left, window_right, softcap_in2, softcap_out, alibi_slope, seed, pid_bh, dropout_p, HEAD_DIM,
                BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, r != 1 and not one_loop,
                USE_TMA, INTERPRET, P_SHIFT, V_T, stride_vd, offs_dv, DV, BDV, one_loop, n_full_hi)

    out, lse = finalize(acc, m_i, l_i, P_SHIFT, Sink, off_h)
    if HAS_DROPOUT:
        out = out * (1.0 / (1.0 - dropout_p))
    if IS_FP8:
        out = out * v_descale
    o_base = Out + off_b64 * stride_ob + q_start.to(tl.int64) * stride_om + off_h.to(tl.int64) * stride_oh
    store_rows(o_base + offs_m[:, None] * stride_om + offs_dv[None, :],
               round_to(out, Out.dtype.element_ty, INTERPRET), offs_m, seqlen_q, offs_dv, DV, BDV)
    lse_base = Lse + off_b64 * stride_lse_b + off_h.to(tl.int64) * stride_lse_h + q_start
    tl.store(lse_base + offs_m, lse, mask=offs_m < seqlen_q)


@triton.jit(do_not_specialize=ROW_COUNTS)
def dropout_probs_kernel(
    Q, K, Lse, Probs, CuSeqlensQ, CuSeqlensK, AlibiSlopes, Seed,
    stride_q, stride_k, stride_lse, stride_alibi_b,
    nheads, group, seqlen_q, seqlen_k, total_q, total_k, qk_scale, window_left, window_right, softcap_in2,
    softcap_out, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, INTERPRET: tl.constexpr, LONG_ROWS: tl.constexpr = False,
):
    """Test-only: the normalised probabilities, negated where dropout dropped them (flash_attn's
    S_dmask encoding), into Probs (batch, heads, max_seqlen_q, max_seqlen_k). This is the one place that
    writes a seqlen_q x seqlen_k array, and only for return_attn_probs=True with dropout."""
    stride_qb, stride_qm, stride_qh = stride_q
    stride_kb, stride_kn, stride_kh = stride_k
    stride_lse_b, stride_lse_h = stride_lse
    if LONG_ROWS:
        stride_qm, stride_kn = stride_qm.to(tl.int64), stride_kn.to(tl.int64)
    start_m = tl.program_id(0) * BLOCK_M
    pid_bh = tl.program_id(1)
    off_b = pid_bh // nheads
    off_h = pid_bh % nheads
    # Probs is (batch, heads, max seqlen_q, max seqlen_k): the dense sizes, before per-sequence ones
    row_base = Probs + (pid_bh.to(tl.int64) * seqlen_q + start_m + tl.arange(0, BLOCK_M)[:, None]) * seqlen_k
    q_start, seqlen_q, k_start, seqlen_k = sequence_bounds(off_b, CuSeqlensQ, CuSeqlensK, seqlen_q, seqlen_k,
                                                           total_q, total_k, IS_VARLEN)
    if start_m >= seqlen_q:
        return
    off_b64 = off_b.to(tl.int64)
    off_hk = (off_h // group).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + off_b64 * stride_qb + (q_start + offs_m[:, None]).to(tl.int64) * stride_qm
                  + off_h.to(tl.int64) * stride_qh + offs_d[None, :], offs_m, seqlen_q, offs_d, HEAD_DIM, BLOCK_D,
                  True)
    lse_base = Lse + off_b64 * stride_lse_b + off_h.to(tl.int64) * stride_lse_h + q_start
    lse = tl.load(lse_base + offs_m, mask=offs_m < seqlen_q, other=float("inf")) * LOG2E
    alibi_slope = alibi_slope_of(AlibiSlopes, off_b, off_h, stride_alibi_b, HAS_ALIBI)
    seed = tl.load(Seed)
    k_base = K + off_b64 * stride_kb + k_start.to(tl.int64) * stride_kn + off_hk * stride_kh
    for start_n in tl.range(0, seqlen_k, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = load_rows(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], offs_n, seqlen_k, offs_d,
                      HEAD_DIM, BLOCK_D, True)
        s, _ = transformed_scores(mma(q, tl.trans(k), None, INTERPRET), offs_m[:, None], offs_n[None, :],
                                  seqlen_q, seqlen_k, qk_scale, softcap_in2, softcap_out, alibi_slope,
                                  HAS_SOFTCAP, HAS_ALIBI)
        visible = score_mask(offs_m[:, None], offs_n[None, :], seqlen_q, seqlen_k, window_left, window_right,
                             HAS_LEFT, HAS_RIGHT)
        p = tl.where(visible, tl.math.exp2(s - lse[:, None]), 0.0)
        keep = dropout_keep(seed, offs_m[:, None], offs_n[None, :], pid_bh, dropout_p)
        tl.store(row_base + offs_n[None, :], tl.where(keep, p, -p).to(Probs.dtype.element_ty),
                 mask=(offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k))


class ForwardPlan:
    """Everything about a forward call but its tensors, worked out once per shape and option set.

    backward_plans holds the backward plans of calls made through this plan, by the gradient's layout
    (ops.py fills it): q, k, v, opts and the outputs' layout are fixed by this plan already."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions, return_probs: bool,
                 config: FwdConfig | None) -> None:
        batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim = problem_dims(q, k, opts)
        varlen = opts.varlen
        block_d = padded_head_dim(head_dim)
        # V's head dim (MLA: unlike q's and k's), which Out takes
        head_dim_v = v.shape[-1]
        block_dv = padded_head_dim(head_dim_v)
        fp8 = q.dtype == torch.float8_e4m3fn
        cfg = config or fwd_config(max(block_d, block_dv), opts.causal, q.device, fp8, seqlen_q)
        self.backward_plans: dict = {}
        # FP8 attention writes bf16, as FlashAttention-3's does
        self.dtype, self.device = torch.bfloat16 if fp8 else q.dtype, q.device
        self.out_shape = (*q.shape[:-1], head_dim_v)
        self.lse_shape = (nheads, q.shape[0]) if varlen else (batch, nheads, seqlen_q)
        self.probs_shape = (batch, nheads, seqlen_q, seqlen_k) if return_probs else None
        self.empty = q.numel() == 0 or batch * seqlen_q == 0
        # FP8 tensor cores read V along the keys: each call copies it keys-last (v_layout.py)
        self.fp8 = fp8
        if fp8:
            v = keys_last_layout(v)
        self.tma_block = (cfg.block_n, block_d) if (cfg.use_tma and not varlen and tma_usable(k, v)
                                                     and head_dim_v == head_dim) else None
        # strides of the outputs this plan allocates
        strides = dict(stride_q=row_strides(q, varlen), stride_k=row_strides(k, varlen),
                       stride_lse=lse_strides(torch.empty(self.lse_shape, device="meta"), varlen))
        named = dict(strides, nheads=nheads, group=nheads // nheads_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                     total_q=q.shape[0], total_k=k.shape[0], HEAD_DIM=head_dim, BLOCK_D=block_d,
                     INTERPRET=INTERPRET, **opts.kernel_args())
        named["LONG_ROWS"] = long_rows(0 if varlen else 1, q, k, v)
        # the forward's own: FP8, and a V whose rows are contiguous (FP8's keys-last copy), read head-dim-strided
        fp8_v = dict(IS_FP8=fp8, V_T=v.stride(-1) != 1, stride_vd=v.stride(-1))
        if head_dim_v != head_dim:
            fp8_v.update(HEAD_DIM_V=head_dim_v, BLOCK_DV=block_dv)
        self.attend = Launch(
            attention_fwd_kernel, (cdiv(seqlen_q, cfg.block_m), batch * nheads, 1), (),
            dict(named, **fp8_v, stride_v=row_strides(v, varlen),
                 stride_o=row_strides(torch.empty(self.out_shape, device="meta"), varlen), BLOCK_M=cfg.block_m,
                 BLOCK_N=cfg.block_n, USE_TMA=self.tma_block is not None, ONE_LOOP=cfg.one_loop),
            cfg.num_warps, cfg.num_stages)
        self.dump = None
        if return_probs:
            # the dump always applies the dropout sign: it has no HAS_DROPOUT flag, which Launch leaves out
            block = 32 if INTERPRET else 64
            self.dump = Launch(dropout_probs_kernel, (cdiv(seqlen_q, block), batch * nheads, 1), (),
                               dict(named, BLOCK_M=block, BLOCK_N=block), 4, 3)

    def __call__(self, q, k, v, opts, descales=(None, None, None)):
        """descales: FP8's (q, k, v) factors, contiguous (batch, nheads_k) fp32."""
        out = common.empty(self.out_shape, self.dtype, self.device)
        lse = common.empty(self.lse_shape, torch.float32, self.device)
        # padded rows and keys of short packed sequences stay 0
        probs = None if self.dump is None else torch.zeros(self.probs_shape, dtype=self.dtype, device=self.device)
        if self.empty:
            return out, lse, probs
        pointers = opts.tensors()
        if self.fp8:
            v = keys_last(v)
        sink = opts.learnable_sink
        if self.tma_block is None:
            self.attend(q, k, v, out, lse, *pointers, *descales, sink)
        else:
            self.attend(q, row_tiles(k, *self.tma_block), row_tiles(v, *self.tma_block), out, lse, *pointers,
                        *descales, sink)
        if probs is not None:
            self.dump(q, k, lse, probs, *pointers)
        return out, lse, probs


_plans = PlanCache()


def plan_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions, return_probs: bool,
             config: FwdConfig | None) -> tuple:
    """Everything a forward plan (of either backend) depends on besides the tensors' contents."""
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.device,
            align(q), align(k), align(v), opts.plan_key(), return_probs, config)


def forward_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions, return_probs: bool = False,
                 config: FwdConfig | None = None) -> ForwardPlan:
    """The plan for these inputs: made on the first call of a shape and option set, then looked up."""
    key = plan_key(q, k, v, opts, return_probs, config)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.add(key, ForwardPlan(q, k, v, opts, return_probs, config))
    return plan


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, opts: AttnOptions,
                      return_probs: bool = False, config: FwdConfig | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launch the forward on checked inputs: dense (batch, seqlen, heads, head_dim) or packed
    (total, heads, head_dim) with opts.cu_seqlens_*. Returns (out, lse, probs or None)."""
    return forward_plan(q, k, v, opts, return_probs, config)(q, k, v, opts)
