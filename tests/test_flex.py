"""flashattn2.flex_attention against a float64 reference by flash_attn's rule, on the CPU interpreter and the
GPU: block masks from mask_mod (partial, full and empty blocks), GQA, seqlen_q != seqlen_k, cut blocks, rows that
see no key, out, lse and gradients; and the named errors."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

import flashattn2
from flashattn2.reference import flex_attention_ref
from helpers import BWD_FACTOR, DEVICE, FWD_FACTOR, assert_close_to_ref, compiled_in_one_graph, randn


def _check(q, k, v, mask_mod, B, H, block_size, enable_gqa=False, scale=None, grads=False, score_mod=None):
    seqlen_q, seqlen_k = q.shape[2], k.shape[2]
    block_mask = flashattn2.create_block_mask(mask_mod, B, H, seqlen_q, seqlen_k, device=DEVICE,
                                              BLOCK_SIZE=block_size)
    q, k, v = (x.detach().requires_grad_(grads) for x in (q, k, v))
    out, lse = flashattn2.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                         enable_gqa=enable_gqa, return_lse=True)
    mask = create_mask(mask_mod, B, H, seqlen_q, seqlen_k, device=DEVICE)
    dout = randn(*out.shape, dtype=out.dtype)
    results = []
    for upcast in (True, False):
        # float64 leaves for the oracle, so its gradients are not rounded back to the input dtype
        ins = [(x.detach().double() if upcast else x.detach()).requires_grad_(grads) for x in (q, k, v)]
        o, o_lse = flex_attention_ref(*ins, mask, scale, upcast=upcast, score_mod=score_mod)
        if grads:
            o.backward(dout.double() if upcast else dout)
        results.append((o, o_lse, *(x.grad for x in ins)))
    (ref, ref_lse, *ref_grads), (pt, _, *pt_grads) = results
    assert out.dtype == q.dtype and lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    assert_close_to_ref("out", out, ref, pt, FWD_FACTOR)
    if grads:
        out.backward(dout)
        for name, x, r, p in zip(("dq", "dk", "dv"), (q, k, v), ref_grads, pt_grads, strict=True):
            assert_close_to_ref(name, x.grad, r, p, BWD_FACTOR)
    empty = ~mask.expand(q.shape[0], q.shape[1], -1, -1).any(-1)
    assert torch.equal(lse.isneginf(), empty)
    torch.testing.assert_close(lse.double()[~empty], ref_lse[~empty], rtol=1e-4, atol=1e-4)
    return block_mask, empty


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flex_document_mask_gqa(dtype):
    # causal packed documents (ids as a captured tensor), queries offset from keys, and a per-head exception:
    # partial, full and skipped blocks; 4 query heads on 2 key heads; seqlen_q != seqlen_k, neither a multiple of
    # the block
    torch.manual_seed(0)
    batch, heads, heads_k, seqlen_q, seqlen_k, head_dim = 2, 4, 2, 200, 300, 64
    q = randn(batch, heads, seqlen_q, head_dim, dtype=dtype)
    k, v = (randn(batch, heads_k, seqlen_k, head_dim, dtype=dtype) for _ in range(2))
    docs = torch.arange(seqlen_k, device=DEVICE) // 128  # three documents, as a captured tensor

    def mask_mod(b, h, q_idx, kv_idx):
        shifted = (q_idx + 64).clamp(max=seqlen_k - 1)  # the queries are keys 64..263
        return ((shifted >= kv_idx) & (docs[kv_idx] == docs[shifted])) | ((h == 3) & (kv_idx < 7))

    block_mask, _ = _check(q, k, v, mask_mod, batch, heads, 64, enable_gqa=True, grads=True)
    # the mask has every kind of block: partial, full, and some left out
    assert block_mask.kv_num_blocks.sum() > 0 and block_mask.full_kv_num_blocks.sum() > 0
    assert (block_mask.kv_num_blocks + block_mask.full_kv_num_blocks < block_mask.kv_indices.shape[-1]).any()


def test_flex_sliding_window_whole_blocks():
    # lengths that are multiples of the mask's blocks (the kernels drop their bounds checks): a causal sliding
    # window, with partial blocks on the diagonal and the window's edge and full blocks between
    torch.manual_seed(4)
    q, k, v = (randn(1, 2, 256, 64, dtype=torch.bfloat16) for _ in range(3))

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < 100)

    block_mask, _ = _check(q, k, v, mask_mod, None, None, 32, grads=True)
    assert block_mask.full_kv_num_blocks.sum() > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flex_head_dim_128_small_blocks_cut_rows(dtype):
    # the fuzzer's finding: 32-row mask blocks at head dim 128 with a query length that cuts the last block gave
    # wrong dK on the H100 (the portable kernels: triton 3.6 pipelined the dK/dV kernel's masked lse/Delta loads
    # wrongly); lengths as the failing cases had them, queries fewer than keys
    torch.manual_seed(11)
    q = randn(1, 2, 150, 128, dtype=dtype)
    k, v = (randn(1, 2, 400, 128, dtype=dtype) for _ in range(2))

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    _check(q, k, v, causal, None, None, (32, 64), grads=True)


def _score_mod(name: str, heads: int, shift: int, cap: float):
    """A score_mod as Flex users write them, over captured tensors where it has any: ALiBi from a slope table,
    softcap, a relative-position bias table; the queries are the keys from `shift` on."""
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)[:heads]
    table = torch.randn(heads, 64, device=DEVICE)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx - shift)

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    def bias_table(score, b, h, q_idx, kv_idx):
        return score + table[h, (kv_idx - q_idx - shift).clamp(-32, 31) + 32]

    return dict(alibi=alibi, softcap=softcap, bias_table=bias_table)[name]


@pytest.mark.parametrize("mod", ["alibi", "softcap", "bias_table"])
def test_flex_score_mods(mod):
    # score_mods as FlexAttention users write them, with captured tensors, under masks with partial and full
    # blocks; forward and gradients (through the mod's derivative) against float64
    torch.manual_seed(7)
    batch, heads, heads_k, seqlen_q, seqlen_k = 1, 4, 2, 96, 160
    q = randn(batch, heads, seqlen_q, 32, dtype=torch.bfloat16)
    k, v = (randn(batch, heads_k, seqlen_k, 32, dtype=torch.bfloat16) for _ in range(2))
    score_mod = _score_mod(mod, heads, 64, 2.0)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + 64

    _check(q, k, v, causal, None, None, 32, enable_gqa=True, grads=True, score_mod=score_mod)


@pytest.mark.parametrize("masked", [True, False])
def test_flex_torch_compile_without_graph_breaks(masked):
    # torch.compile(fullgraph=True) of a function calling flex_attention with a block mask and a score_mod over a
    # captured tensor (or neither): one graph, no break, and out and gradients by flash_attn's rule against float64
    torch.manual_seed(11)
    q = randn(1, 2, 96, 32, dtype=torch.bfloat16)
    k, v = (randn(1, 2, 128, 32, dtype=torch.bfloat16) for _ in range(2))
    slopes = torch.tensor([0.5, 0.25], device=DEVICE)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + 32

    block_mask = flashattn2.create_block_mask(causal, None, None, 96, 128, device=DEVICE, BLOCK_SIZE=32) \
        if masked else None
    score_mod = alibi if masked else None

    def attend(q, k, v, block_mask):
        return flashattn2.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

    compiled = compiled_in_one_graph(attend, q, k, v, block_mask)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = compiled(*leaves, block_mask)
    dout = randn(*out.shape, dtype=out.dtype)
    out.backward(dout)
    mask = create_mask(causal, 1, 2, 96, 128, device=DEVICE) if masked else None
    results = []
    for upcast in (True, False):
        ins = [(x.detach().double() if upcast else x.detach()).requires_grad_() for x in (q, k, v)]
        o, _ = flex_attention_ref(*ins, mask, upcast=upcast, score_mod=score_mod)
        o.backward(dout.double() if upcast else dout)
        results.append((o, *(x.grad for x in ins)))
    (ref, *ref_grads), (pt, *pt_grads) = results
    assert_close_to_ref("out", out, ref, pt, FWD_FACTOR)
    for name, x, r, p in zip(("dq", "dk", "dv"), leaves, ref_grads, pt_grads, strict=True):
        assert_close_to_ref(name, x.grad, r, p, BWD_FACTOR)


def test_flex_empty_rows_and_broadcast_mask():
    # a mask shared by batch and heads (B = H = None) that leaves some rows with no key: out 0, lse -inf
    torch.manual_seed(1)
    q, k, v = (randn(2, 3, 160, 40, dtype=torch.bfloat16) for _ in range(3))

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx - 20) & (kv_idx % 3 != 1)

    _, empty = _check(q, k, v, mask_mod, None, None, (32, 64), scale=0.3, grads=True)
    assert empty.any()
    out = flashattn2.flex_attention(q, k, v, block_mask=flashattn2.create_block_mask(
        mask_mod, None, None, 160, 160, device=DEVICE, BLOCK_SIZE=(32, 64)))
    assert (out[empty] == 0).all()


def test_flex_without_block_mask():
    torch.manual_seed(2)
    q, k, v = (randn(1, 2, 130, 128, dtype=torch.float16) for _ in range(3))
    out = flashattn2.flex_attention(q, k, v)
    ref, _ = flex_attention_ref(q, k, v)
    pt, _ = flex_attention_ref(q, k, v, upcast=False)
    assert_close_to_ref("out", out, ref, pt, FWD_FACTOR)


def test_flex_errors_name_the_problem():
    torch.manual_seed(3)
    q, k, v = (randn(1, 2, 64, 32, dtype=torch.bfloat16) for _ in range(3))
    causal = flashattn2.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 64, 64,
                                          device=DEVICE)
    with pytest.raises(TypeError, match="float16 and bfloat16"):
        flashattn2.flex_attention(q.float(), k.float(), v.float(), block_mask=causal)
    other = flashattn2.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 128, 64,
                                         device=DEVICE)
    with pytest.raises(ValueError, match=r"made for \(Q_LEN, KV_LEN\) = \(128, 64\)"):
        flashattn2.flex_attention(q, k, v, block_mask=other)
    with pytest.raises(NotImplementedError, match="erfinv"):
        flashattn2.flex_attention(q, k, v, score_mod=lambda score, b, h, q_idx, kv_idx: torch.erfinv(score))
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flashattn2.flex_attention(q, k[:, :1], v[:, :1], block_mask=causal)
    with pytest.raises(TypeError, match="BlockMask"):
        flashattn2.flex_attention(q, k, v, block_mask=torch.ones(64, 64, dtype=torch.bool))


def _hopper():
    # where the Gluon kernels run flex calls: an sm_90 GPU, unless FLASHATTN2_BACKEND=triton keeps them off
    from flashattn2.kernels.backends import get_backend

    return (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and get_backend() != "triton")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,dtype", [(128, torch.bfloat16), (64, torch.float16), (256, torch.bfloat16)])
def test_flex_hopper_kernels(head_dim, dtype):
    # whole 128-blocks, the Gluon kernels' block-sparse mode on Hopper (the portable kernels elsewhere), forward and
    # backward: packed causal documents per batch entry (a captured tensor) with a per-head exception, GQA,
    # seqlen_q != seqlen_k, rows that see no key; then a mask with no partial block, and none at all
    from flashattn2.kernels.backends import flex_backward_backend, flex_forward_backend

    torch.manual_seed(5)
    batch, heads, heads_k, seqlen_q, seqlen_k = 2, 4, 2, 384, 640
    q = randn(batch, heads, seqlen_q, head_dim, dtype=dtype)
    k, v = (randn(batch, heads_k, seqlen_k, head_dim, dtype=dtype) for _ in range(2))
    docs = torch.stack([torch.arange(seqlen_k, device=DEVICE) // 200, torch.arange(seqlen_k, device=DEVICE) // 300])

    def mask_mod(b, h, q_idx, kv_idx):
        shifted = q_idx + 256  # the queries are the last 384 keys
        same = docs[b, kv_idx] == docs[b, shifted]
        return ((shifted >= kv_idx) & same & (q_idx >= 40)) | ((h == 1) & (kv_idx < 7))

    block_mask = flashattn2.create_block_mask(mask_mod, batch, heads, seqlen_q, seqlen_k, device=DEVICE)
    for choose in (flex_forward_backend, flex_backward_backend):
        backend, why = choose(q, k, v, block_mask)
        assert (backend == "gluon-sm90") == _hopper(), why
    _, empty = _check(q, k, v, mask_mod, batch, heads, 128, enable_gqa=True, grads=True)
    assert empty.any()

    def blocks(b, h, q_idx, kv_idx):  # whole blocks only: no partial block, some left out
        return (q_idx // 128 + kv_idx // 128) % 3 != 1

    _check(q, k, v, blocks, None, None, 128, enable_gqa=True, grads=True)
    out = flashattn2.flex_attention(q, k, v, enable_gqa=True)
    ref, _ = flex_attention_ref(q, k, v)
    pt, _ = flex_attention_ref(q, k, v, upcast=False)
    assert_close_to_ref("out", out, ref, pt, FWD_FACTOR)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,dtype", [(128, torch.bfloat16), (64, torch.float16), (256, torch.bfloat16)])
@pytest.mark.parametrize("mod", ["alibi", "softcap", "bias_table"])
def test_flex_hopper_score_mods(mod, head_dim, dtype):
    # score_mods compiled into the Gluon kernels (ScoreMod) on whole 128-blocks: a captured slope table, softcap
    # (its derivative in the backward), a relative-position bias table; partial, full and empty blocks, GQA,
    # seqlen_q != seqlen_k, forward and gradients against float64
    from flashattn2.kernels.backends import flex_backward_backend, flex_forward_backend

    torch.manual_seed(9)
    batch, heads, heads_k, seqlen_q, seqlen_k = 2, 4, 2, 256, 512
    q = randn(batch, heads, seqlen_q, head_dim, dtype=dtype)
    k, v = (randn(batch, heads_k, seqlen_k, head_dim, dtype=dtype) for _ in range(2))
    score_mod = _score_mod(mod, heads, 256, 5.0)

    def mask_mod(b, h, q_idx, kv_idx):  # causal, the queries the last 256 keys, and a window of 300
        return (kv_idx <= q_idx + 256) & (q_idx + 256 - kv_idx < 300)

    block_mask = flashattn2.create_block_mask(mask_mod, None, None, seqlen_q, seqlen_k, device=DEVICE)
    for choose in (flex_forward_backend, flex_backward_backend):
        backend, why = choose(q, k, v, block_mask)
        assert (backend == "gluon-sm90") == _hopper(), why
    _check(q, k, v, mask_mod, None, None, 128, enable_gqa=True, grads=True, score_mod=score_mod)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["window", "block_sparse"])
def test_flex_long_context_linear_memory(pattern):
    # 128k tokens under a 4k causal sliding window and a 10%-dense block-sparse pattern (a captured block table),
    # forward and backward: sampled rows of out, lse and dq against float64, and the peak memory of 64k -> 128k
    # growing no faster than the tokens (no seqlen x seqlen buffer anywhere)
    torch.manual_seed(6)
    heads, head_dim, dtype = 2, 128, torch.bfloat16
    peaks = {}
    for seqlen in (65536, 131072):
        n_blocks = seqlen // 128
        table = (torch.rand(n_blocks, n_blocks, device=DEVICE) < 0.1) | torch.eye(n_blocks, dtype=torch.bool,
                                                                                  device=DEVICE)

        def mask_mod(b, h, q_idx, kv_idx, table=table):
            if pattern == "window":
                return (kv_idx <= q_idx) & (q_idx - kv_idx < 4096)
            return table[q_idx // 128, kv_idx // 128]

        block_mask = flashattn2.create_block_mask(mask_mod, None, None, seqlen, seqlen, device=DEVICE, _compile=True)
        q, k, v = (randn(1, heads, seqlen, head_dim, dtype=dtype).requires_grad_() for _ in range(3))
        flashattn2.flex_attention(q, k, v, block_mask=block_mask)  # the mask bits, made once, outside the peak
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out, lse = flashattn2.flex_attention(q, k, v, block_mask=block_mask, return_lse=True)
        dout = randn(*out.shape, dtype=dtype)
        out.backward(dout)
        torch.cuda.synchronize()
        peaks[seqlen] = torch.cuda.max_memory_allocated() - base
        rows = torch.randint(0, seqlen, (48,), device=DEVICE)
        mask = torch.vmap(torch.vmap(lambda qi, ki: mask_mod(0, 0, qi, ki), (None, 0)), (0, None))(
            rows, torch.arange(seqlen, device=DEVICE))[None, None]
        results = []
        for upcast in (True, False):
            q_rows = q.detach()[:, :, rows]
            q_rows = (q_rows.double() if upcast else q_rows).requires_grad_()
            o, o_lse = flex_attention_ref(q_rows, k.detach(), v.detach(), mask, upcast=upcast)
            o.backward(dout[:, :, rows].double() if upcast else dout[:, :, rows])
            results.append((o, o_lse, q_rows.grad))
        (ref, ref_lse, ref_dq), (pt, _, pt_dq) = results
        assert_close_to_ref("out", out[:, :, rows], ref, pt, FWD_FACTOR)
        torch.testing.assert_close(lse[:, :, rows].double(), ref_lse, rtol=1e-4, atol=1e-4)
        assert_close_to_ref("dq", q.grad[:, :, rows], ref_dq, pt_dq, BWD_FACTOR)
        assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all() and k.grad.abs().sum() > 0
    assert peaks[131072] <= 2.2 * peaks[65536], peaks
