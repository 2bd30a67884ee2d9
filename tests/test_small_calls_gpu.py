"""GPU-only: no device-to-host sync on any call, CUDA-graph capture of a training step (dropout off
and on) matching eager bit for bit, and bad cu_seqlens judged on the device."""

import pytest
import torch
import torch.nn as nn

import flashattn2
from flashattn2.kernels.portable import cu_seqlens
from helpers import randn

pytestmark = pytest.mark.gpu

DTYPE = torch.bfloat16


def _dense(nheads=4, nheads_k=2, seqlen=200, head_dim=64):
    q = randn(2, seqlen, nheads, head_dim, dtype=DTYPE, requires_grad=True)
    k = randn(2, seqlen, nheads_k, head_dim, dtype=DTYPE, requires_grad=True)
    v = randn(2, seqlen, nheads_k, head_dim, dtype=DTYPE, requires_grad=True)
    return q, k, v


def _calls():
    """(name, zero-argument call returning (out, leaves)) for every public function and option."""
    q, k, v = _dense()
    qkv = randn(2, 200, 3, 4, 64, dtype=DTYPE, requires_grad=True)
    kv = randn(2, 200, 2, 2, 64, dtype=DTYPE, requires_grad=True)
    cu = torch.tensor([0, 37, 37, 200, 390], dtype=torch.int32, device="cuda")
    pq, pk, pv = (x.detach().flatten(0, 1)[:390].clone().requires_grad_() for x in (q, k, v))
    pqkv = qkv.detach().flatten(0, 1)[:390].clone().requires_grad_()
    pkv = kv.detach().flatten(0, 1)[:390].clone().requires_grad_()
    slopes = torch.rand(4, dtype=torch.float32, device="cuda")
    f = flashattn2
    return {
        "plain": lambda: (f.flash_attn_func(q, k, v), (q, k, v)),
        "causal": lambda: (f.flash_attn_func(q, k, v, causal=True), (q, k, v)),
        "window": lambda: (f.flash_attn_func(q, k, v, window_size=(48, 8)), (q, k, v)),
        "softcap-alibi": lambda: (f.flash_attn_func(q, k, v, softcap=20.0, alibi_slopes=slopes), (q, k, v)),
        "dropout": lambda: (f.flash_attn_func(q, k, v, dropout_p=0.1, causal=True), (q, k, v)),
        "deterministic": lambda: (f.flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v)),
        "lse": lambda: (f.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[0], (q, k, v)),
        "qkvpacked": lambda: (f.flash_attn_qkvpacked_func(qkv, causal=True), (qkv,)),
        "kvpacked": lambda: (f.flash_attn_kvpacked_func(q, kv, causal=True), (q, kv)),
        "varlen": lambda: (f.flash_attn_varlen_func(pq, pk, pv, cu, cu, 190, 190, causal=True), (pq, pk, pv)),
        "varlen-dropout": lambda: (f.flash_attn_varlen_func(pq, pk, pv, cu, cu, 190, 190, dropout_p=0.2),
                                   (pq, pk, pv)),
        "varlen-qkvpacked": lambda: (f.flash_attn_varlen_qkvpacked_func(pqkv, cu, 190, causal=True), (pqkv,)),
        "varlen-kvpacked": lambda: (f.flash_attn_varlen_kvpacked_func(pq, pkv, cu, cu, 190, 190), (pq, pkv)),
    }


def test_every_call_form_is_covered():
    assert sorted(_calls()) == sorted(CALLS)


def test_sync_debug_mode_catches_a_sync():
    """The no-sync test below relies on this: a real sync raises under the mode."""
    x = torch.ones(1, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            x.item()
    finally:
        torch.cuda.set_sync_debug_mode(0)


CALLS = ["plain", "causal", "window", "softcap-alibi", "dropout", "deterministic", "lse", "qkvpacked", "kvpacked",
         "varlen", "varlen-dropout", "varlen-qkvpacked", "varlen-kvpacked"]


@pytest.mark.parametrize("name", CALLS)
def test_no_device_sync_forward_or_backward(name):
    call = _calls()[name]
    out, leaves = call()  # the first call compiles; later ones are the steady state
    out.float().sum().backward()
    torch.cuda.synchronize()
    dout = torch.randn_like(out)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            for x in leaves:
                x.grad = None
            out, _ = call()
            out.backward(dout)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


class _Block(nn.Module):
    """A pre-norm transformer block whose attention is flashattn2's."""

    def __init__(self, dim=256, heads=4, dropout_p=0.0):
        super().__init__()
        self.heads, self.dropout_p = heads, dropout_p
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, s, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads)
        attn = flashattn2.flash_attn_qkvpacked_func(qkv, dropout_p=self.dropout_p, causal=True)
        x = x + self.proj(attn.reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


def _loss(model, x):
    return model(x).float().square().mean()


@pytest.mark.parametrize("dropout_p", [0.0, 0.15])
def test_training_step_in_a_cuda_graph_matches_eager_bitwise(dropout_p):
    torch.manual_seed(0)
    model = _Block(dropout_p=dropout_p).cuda().to(DTYPE)
    static_x = randn(2, 300, 256, dtype=DTYPE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles, allocator pools) off the capture
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            _loss(model, static_x).backward()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = _loss(model, static_x)
        static_loss.backward()
    static_grads = [p.grad for p in model.parameters()]

    results = []
    for trial in range(3):
        x = randn(2, 300, 256, dtype=DTYPE)
        static_x.copy_(x)
        torch.manual_seed(1000 + trial)
        graph.replay()
        replayed = [static_loss.clone()] + [g.clone() for g in static_grads]
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1000 + trial)
        loss = _loss(model, x)
        loss.backward()
        eager = [loss.detach()] + [p.grad for p in model.parameters()]
        for i, (a, b) in enumerate(zip(replayed, eager, strict=True)):
            assert torch.equal(a, b), f"trial {trial}: tensor {i} differs between graph replay and eager"
        results.append(replayed[0])
    # new inputs give new results (the replay did not just return the captured step)
    assert not torch.equal(results[0], results[1])
    if dropout_p > 0:
        # the same inputs with another seed give another dropout mask, also under the graph
        static_x.copy_(x)
        torch.manual_seed(7)
        graph.replay()
        assert not torch.equal(static_loss, results[-1])


def test_varlen_forward_backward_in_a_cuda_graph():
    cu = torch.tensor([0, 100, 100, 333], dtype=torch.int32, device="cuda")
    q = randn(333, 4, 64, dtype=DTYPE, requires_grad=True)
    k = randn(333, 2, 64, dtype=DTYPE, requires_grad=True)
    v = randn(333, 2, 64, dtype=DTYPE, requires_grad=True)
    dout = randn(333, 4, 64, dtype=DTYPE)

    def step():
        out = flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, 233, 233, causal=True)
        out.backward(dout)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            q.grad = k.grad = v.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    q.grad = k.grad = v.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    static_grads = (q.grad, k.grad, v.grad)
    for _ in range(2):
        for x in (q, k, v, dout):
            x.data.copy_(torch.randn_like(x))
        graph.replay()
        q.grad = k.grad = v.grad = None
        out = step()
        assert torch.equal(out, static_out)
        for a, b in zip((q.grad, k.grad, v.grad), static_grads, strict=True):
            assert torch.equal(a, b)


def test_bad_cu_seqlens_poison_outputs_then_raise():
    q = randn(64, 2, 64, dtype=DTYPE)
    k = randn(64, 2, 64, dtype=DTYPE)
    good = torch.tensor([0, 30, 64], dtype=torch.int32, device="cuda")
    for bad, match in ((torch.tensor([0, 10**6, 64], dtype=torch.int32, device="cuda"), "longer than max_seqlen"),
                       (torch.tensor([5, 30, 64], dtype=torch.int32, device="cuda"), "must start at 0"),
                       (torch.tensor([0, 40, 30], dtype=torch.int32, device="cuda"), "must not decrease"),
                       (torch.tensor([0, -(2**31), 2**31 - 1], dtype=torch.int32, device="cuda"), "cu_seqlens_k")):
        try:
            out = flashattn2.flash_attn_varlen_func(q, k, k, good, bad, 34, 34)
            torch.cuda.synchronize()  # no illegal access: the kernels stayed inside q, k and v
            assert torch.isnan(out).all(), "the outputs of a call with bad cu_seqlens must be NaN"
        except ValueError as exc:  # the GPU was quick enough for the call itself to see its check
            assert match in str(exc)
        else:
            with pytest.raises(ValueError, match=match):
                flashattn2.flash_attn_varlen_func(q, k, k, good, good, 34, 34)
        out = flashattn2.flash_attn_varlen_func(q, k, k, good, good, 34, 34)  # the flag was cleared
        assert not torch.isnan(out).any()


def test_sync_checks_raise_in_the_bad_call(monkeypatch):
    monkeypatch.setattr(cu_seqlens, "SYNC_CHECKS", True)
    q = randn(64, 2, 64, dtype=DTYPE)
    bad = torch.tensor([0, 40, 30], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="cu_seqlens_q must not decrease"):
        flashattn2.flash_attn_varlen_func(q, q, q, bad, torch.tensor([0, 30, 64], dtype=torch.int32, device="cuda"),
                                          64, 64)
