"""Host-side logic that the GPU tests rely on, checked on any machine: the launch cache, the eager
and traced dispatch, and cu_seqlens values that are judged on the device."""

import pytest
import torch

import flashattn2
from flashattn2 import ops
from flashattn2.kernels import launch
from flashattn2.kernels.params import AttnOptions
from flashattn2.kernels.portable import cu_seqlens
from flashattn2.kernels.portable.backward import attention_backward
from flashattn2.kernels.portable.forward import attention_forward
from helpers import DEVICE, randn


class _FakeCompiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, calls):
        self.calls = calls

    def run(self, *args):
        self.calls.append(("fast", args))


class _FakeKernel:
    arg_names = ["X", "Y", "stride", "n", "scale", "BLOCK"]

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def runner(*args, **kwargs):
            self.calls.append(("triton", args, kwargs))
            return _FakeCompiled(self.calls)
        return runner


@pytest.fixture
def fast_launch(monkeypatch):
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "_hooks_set", lambda: False)
    monkeypatch.setattr(launch, "_current_stream", lambda: 7)


def test_launch_goes_through_triton_once_then_straight_to_the_compiled_kernel(fast_launch, monkeypatch):
    kernel = _FakeKernel()
    x = torch.zeros(64, dtype=torch.float16)
    y = torch.zeros(64, dtype=torch.float32)
    run = launch.Launch(kernel, (3, 2, 1), (16,), dict(n=100, scale=0.5, BLOCK=32), 4, 2)
    run(x, y)
    assert kernel.calls[-1] == ("triton", (x, y, 16), dict(n=100, scale=0.5, BLOCK=32, num_warps=4, num_stages=2))
    run(y, x)
    # every argument in the kernel's order, after Triton's launcher arguments (grid, stream, function,
    # metadata, no launch metadata or hooks)
    assert kernel.calls[-1] == ("fast", (3, 2, 1, 7, "fn", "meta", None, None, None, y, x, 16, 100, 0.5, 32))
    # a profiler's hook: Triton's own path, which calls it
    monkeypatch.setattr(launch, "_hooks_set", lambda: True)
    run(x, y)
    assert kernel.calls[-1][0] == "triton"


def test_launch_hands_tuple_arguments_to_the_compiled_kernel_unchanged(fast_launch):
    # the portable kernels take their strides as (batch, row, head) tuples by name; Triton's launcher flattens
    # tuples itself (JITFunction.run hands kernel.run the bound values as they are), so the fast path must too
    kernel = _FakeKernel()
    kernel.arg_names = ["X", "Y", "stride", "n", "scale", "BLOCK"]
    x = torch.zeros(64, dtype=torch.float16)
    run = launch.Launch(kernel, (1, 1, 1), (), dict(stride=(8, 4, 1), n=100, scale=0.5, BLOCK=32), 4, 2)
    run(x, x)
    assert kernel.calls[-1][1:] == ((x, x), dict(stride=(8, 4, 1), n=100, scale=0.5, BLOCK=32, num_warps=4,
                                                 num_stages=2))
    run(x, x)
    assert kernel.calls[-1] == ("fast", (1, 1, 1, 7, "fn", "meta", None, None, None, x, x, (8, 4, 1), 100, 0.5, 32))


def test_launch_fast_path_passes_defaults_of_arguments_left_out(fast_launch):
    # a Gluon forward call without a block mask leaves its list arguments out (their defaults, None): the fast path
    # hands the compiled kernel every argument, so it takes them from the signature
    from types import SimpleNamespace

    kernel = _FakeKernel()  # Triton's JITFunction.params: name, has_default, default (absent under the interpreter)
    kernel.arg_names = ["X", "n", "Lists", "SPARSE"]
    kernel.params = [SimpleNamespace(name=name, has_default=name in ("Lists", "SPARSE"),
                                     default=dict(Lists=None, SPARSE=128).get(name)) for name in kernel.arg_names]
    x = torch.zeros(64, dtype=torch.float16)
    run = launch.Launch(kernel, (1, 1, 1), (), dict(n=5), 4, 2)
    run(x)
    run(x)
    assert kernel.calls[-1] == ("fast", (1, 1, 1, 7, "fn", "meta", None, None, None, x, 5, None, 128))


def _triton36_launcher(module, indices, metas, scratch=0):
    """A compiled kernel's launcher laid out as triton 3.6's CudaLauncher: `launch` a closure over the C launcher that
    encodes each descriptor argument (module.make_tensordesc_arg) on every call; the C launcher records its
    arguments."""
    raw_calls = []

    def wrap(launcher, tensordesc_indices, tensordesc_meta):
        def inner(*args, encode=module.make_tensordesc_arg):  # a default, not a closure cell: 3.6's three cells
            final, j = list(args[:13]), 0
            for i, arg in enumerate(args[13:]):
                if i in tensordesc_indices:
                    final.extend(encode(arg, tensordesc_meta[j]))
                    j += 1
                else:
                    final.append(arg)
            return launcher(*final)
        return inner

    class CudaLauncher:
        global_scratch_size = profile_scratch_size = scratch
        launch_cooperative_grid, launch_pdl = False, True

        def __init__(self):
            self.launch = wrap(lambda *a: raw_calls.append(a), set(indices), metas)

        def __call__(self, gx, gy, gz, stream, function, *args):
            self.launch(gx, gy, gz, stream, function, self.launch_cooperative_grid, self.launch_pdl, None, None,
                        *args)

    CudaLauncher.__module__ = module.__name__
    return CudaLauncher(), raw_calls


@pytest.mark.parametrize("scratch", [0, 1])
def test_launch_encodes_a_descriptor_once_per_address_and_shape(fast_launch, monkeypatch, scratch):
    # Triton 3.6's launcher encodes every descriptor on every call; Launch hands the C launcher what that step would
    # give, encoded once per (address, shape, strides). A launcher that allocates scratch: Triton's path every call.
    import sys
    import types
    from collections import namedtuple

    module = types.ModuleType("fake_triton36_driver")
    encodes = []

    def make_tensordesc_arg(desc, meta):
        encodes.append(desc.base.data_ptr())
        return [("map", desc.base.data_ptr(), tuple(desc.shape), tuple(desc.block_shape), meta), *desc.shape,
                *desc.strides]

    module.make_tensordesc_arg, module._BASE_ARGS_FORMAT_LEN = make_tensordesc_arg, 13
    monkeypatch.setitem(sys.modules, module.__name__, module)
    run, raw_calls = _triton36_launcher(module, [0, 2], ["meta-q", "meta-k"], scratch)
    compiled = types.SimpleNamespace(run=run, function="fn", packed_metadata="meta")
    triton_calls = []

    class Kernel(_FakeKernel):
        def __getitem__(self, grid):
            return lambda *args, **kwargs: triton_calls.append(args) or compiled

    kernel = Kernel()
    kernel.arg_names = ["Q", "X", "K", "n", "BLOCK"]
    Desc = namedtuple("Desc", "base shape strides block_shape layout")
    q, k, x = torch.zeros(2, 8, 1, 16), torch.zeros(2, 8, 1, 16), torch.zeros(4)
    fixed = launch.Launch(kernel, (3, 2, 1), (), dict(n=5, BLOCK=64), 4, 1)

    def tiles(t):
        return launch.Tiles(t, [1, 4, 1, 16], "layout", Desc)

    fixed(tiles(q), x, tiles(k))
    assert triton_calls[-1][0] == Desc(q, [2, 8, 1, 16], list(q.stride()), [1, 4, 1, 16], "layout")
    ours = []
    for args in ((q, x, k), (q, x, k), (q.clone(), x, k), (q.view(2, 8, 2, 8), x, k)):
        before = len(encodes)
        fixed(*(tiles(a) if a is not x else a for a in args))
        got, ours = raw_calls[-1], ours + encodes[before:]
        # what Triton's own path gives the C launcher for the same call
        run(3, 2, 1, 7, "fn", "meta", None, None, None, *(Desc(a, list(a.shape), list(a.stride()), [1, 4, 1, 16],
                                                                 "layout") if a is not x else a for a in args), 5, 64)
        assert got == raw_calls[-1]
    if scratch:
        assert len(ours) == 2 * 4  # q and k on every call
    else:
        # q and k on the first fast call; then the new q; then q of another shape at the same address
        assert ours == [q.data_ptr(), k.data_ptr(), ours[2], q.data_ptr()] and ours[2] != q.data_ptr()


def test_hooks_are_seen():
    import triton

    hooks = triton.knobs.runtime.launch_enter_hook
    assert not launch._hooks_set()
    hook = lambda metadata: None  # noqa: E731
    hooks.add(hook)
    try:
        assert launch._hooks_set()
    finally:
        hooks.remove(hook)


@pytest.mark.parametrize("change", ["unaligned", "dtype", "stride", "window", "alibi", "varlen-pointer"])
def test_plan_keys_separate_what_triton_specialises_on(change):
    """A launch plan is reused only for tensors Triton would compile the same way."""
    from flashattn2.kernels.portable import forward

    base = torch.zeros(2 * 40 * 2 * 32 + 8, dtype=torch.float16, device=DEVICE)
    q = base[:2 * 40 * 2 * 32].view(2, 40, 2, 32)
    opts = AttnOptions(softmax_scale=0.2)
    key = _forward_key(forward, q, opts)
    if change == "unaligned":
        other = _forward_key(forward, base[1:2 * 40 * 2 * 32 + 1].view(2, 40, 2, 32), opts)
    elif change == "dtype":
        other = _forward_key(forward, q.to(torch.bfloat16), opts)
    elif change == "stride":
        other = _forward_key(forward, torch.zeros(2, 40, 2, 40, dtype=torch.float16, device=DEVICE)[..., :32], opts)
    elif change == "window":
        other = _forward_key(forward, q, opts._replace(window_left=8))
    elif change == "alibi":
        other = _forward_key(forward, q, opts._replace(alibi_slopes=torch.ones(2, device=DEVICE)))
    else:
        cu = torch.zeros(4, dtype=torch.int32, device=DEVICE)
        other = _forward_key(forward, q, opts._replace(cu_seqlens_q=cu[1:], cu_seqlens_k=cu[1:]))
        assert other != _forward_key(forward, q, opts._replace(cu_seqlens_q=cu[:3], cu_seqlens_k=cu[:3]))
    assert other != key
    assert _forward_key(forward, q.clone(), opts) == key


def _forward_key(forward, q, opts):
    """The plan key attention_forward used for (q, q, q): the cache's newest entry."""
    forward._plans.clear()
    try:
        forward.attention_forward(q, q, q, opts)
    except Exception:  # the key is made before any launch; only its value matters here
        pass
    (key,) = forward._plans
    return key


def test_eager_calls_skip_the_custom_op_and_tracing_uses_it(monkeypatch):
    q, k, v = (randn(1, 20, 2, 32, dtype=torch.float16, requires_grad=True) for _ in range(3))
    calls = []
    original = ops._fwd_op

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.ops.flashattn2, "fwd", spy)
    flashattn2.flash_attn_func(q, k, v, causal=True).sum().backward()
    assert calls == []
    assert ops.is_traced(q) is False
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = mode.from_tensor(q)
        assert ops.is_traced(fake)


def _varlen(total=48, nheads=2, head_dim=32):
    return tuple(randn(total, nheads, head_dim, dtype=torch.float16) for _ in range(3))


@pytest.mark.parametrize("cu", [[0, 10**6, 48], [0, -(2**31), 48], [-5, 20, 48], [0, 40, 30], [0, 20, 2**31 - 1]])
def test_bad_cu_seqlens_stay_inside_the_tensors(cu):
    """The kernels clamp sequences to the rows of q, k and to max_seqlen, so wild values never move a
    load or store out of the tensors (the interpreter would read or write foreign memory)."""
    q, k, v = _varlen()
    bad = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    good = torch.tensor([0, 20, 48], dtype=torch.int32, device=DEVICE)
    for cu_q, cu_k in ((bad, good), (good, bad)):
        opts = AttnOptions(softmax_scale=0.2, window_right=0, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=28,
                           max_seqlen_k=28)
        out, lse, probs = attention_forward(q, k, v, opts._replace(dropout_p=0.3, rng_seed=torch.zeros(
            1, dtype=torch.int64, device=DEVICE)), return_probs=True)
        assert probs.shape == (2, 2, 28, 28)
        attention_backward(torch.randn_like(out), q, k, v, out, lse, opts)


@pytest.mark.parametrize("cu,message", [
    ([1, 20, 48], "cu_seqlens_q must start at 0"),
    ([0, 30, 20, 48], "cu_seqlens_q must not decrease"),
    ([0, 20, 47], "cu_seqlens_q must end at the number of rows of q"),
    ([0, 40, 48], "cu_seqlens_q has a sequence longer than max_seqlen_q"),
])
def test_check_and_poison_names_the_problem_and_poisons_outputs(cu, message):
    cu_q = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    cu_k = torch.arange(len(cu), dtype=torch.int32, device=DEVICE)  # valid: sequences of one key
    outs = (torch.zeros(48, 2, 8, dtype=torch.bfloat16, device=DEVICE), torch.zeros(2, 48, device=DEVICE))
    with pytest.raises(ValueError, match=message):
        cu_seqlens.check_and_poison(cu_q, cu_k, 48, len(cu) - 1, 30, 1, outs)
        # on a GPU the check may still be running when the call returns: the next call raises
        if cu_q.is_cuda:
            torch.cuda.synchronize()
        cu_seqlens.raise_pending(cu_q.device)
    assert all(torch.isnan(x).all() for x in outs)
    # the flag was cleared with the raise: a good call passes and leaves its outputs alone
    cu_seqlens.check_and_poison(torch.tensor([0, 20, 48], dtype=torch.int32, device=DEVICE), cu_k[:3], 48, 2, 30, 1,
                                (outs[1].zero_(),))
    assert not outs[1].isnan().any()


def test_check_and_poison_with_no_rows_to_fill():
    # a packed batch without query rows (fuzz seed 9, case 4832) has only empty outputs: the kernel's NaN fill takes
    # a spare float buffer, not an index tensor (an int32 buffer did not compile for sm_90)
    cu_q = torch.tensor([0, 0], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 37], dtype=torch.int32, device=DEVICE)
    outs = (torch.empty(0, 2, 8, dtype=torch.float16, device=DEVICE), torch.empty(2, 0, device=DEVICE))
    targets, sizes = cu_seqlens.poison_targets(outs, cu_q.device)
    assert len(targets) == 3 and all(x.dtype.is_floating_point and x.numel() > 0 for x in targets)
    assert sizes == [0, 0, 0]
    cu_seqlens.check_and_poison(cu_q, cu_k, 0, 37, 0, 37, outs)
    if cu_q.is_cuda:
        torch.cuda.synchronize()
    cu_seqlens.raise_pending(cu_q.device)
    # bad values with nothing to fill still raise
    with pytest.raises(ValueError, match="cu_seqlens_k must end at the number of rows of k"):
        cu_seqlens.check_and_poison(cu_q, cu_k, 0, 40, 0, 37, outs)
        if cu_q.is_cuda:
            torch.cuda.synchronize()
        cu_seqlens.raise_pending(cu_q.device)


def test_describe_lists_every_failed_check_of_q_and_k():
    text = cu_seqlens.describe(0b0101 | (0b1000 << 4))
    assert text == ("cu_seqlens_q must start at 0, must end at the number of rows of q; "
                    "cu_seqlens_k has a sequence longer than max_seqlen_k")


def test_a_repeated_call_skips_the_checks_and_gives_the_same_result():
    from flashattn2 import interface

    interface._seen.clear()
    q, k, v = (randn(1, 24, 2, 32, dtype=torch.float16) for _ in range(3))
    first = flashattn2.flash_attn_func(q, k, v, causal=True)
    assert len(interface._seen) == 1
    again = flashattn2.flash_attn_func(q, k, v, causal=True)
    assert len(interface._seen) == 1  # found, not added
    assert torch.equal(first, again)
    # what the checks refuse never matches a remembered call
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn2.flash_attn_func(q, k, v, causal=True, dropout_p=1.0)
    with pytest.raises(TypeError, match="one dtype"):
        flashattn2.flash_attn_func(q, k.bfloat16(), v, causal=True)
    # another pointer alignment is another entry (its kernels may be compiled differently)
    shifted = torch.empty(q.numel() + 8, dtype=q.dtype, device=q.device)[1:q.numel() + 1].view(q.shape)
    shifted.copy_(q)
    assert torch.equal(flashattn2.flash_attn_func(shifted, k, v, causal=True), first)
    assert len(interface._seen) == 2


def test_a_repeated_fp8_call_skips_the_checks_but_not_the_descales_checks():
    from flashattn2 import interface

    interface._seen.clear()
    torch.manual_seed(3)
    q, k, v = (randn(1, 40, 2, 32, dtype=torch.bfloat16) for _ in range(3))
    q8, k8, v8, qd, kd, vd = flashattn2.quantize_fp8(q, k, v)
    first = flashattn2.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    assert len(interface._seen) == 1
    again = flashattn2.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    assert len(interface._seen) == 1  # found, not added
    assert torch.equal(first, again)
    # the descales' values are inputs, not part of the key
    halved = flashattn2.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd / 2)
    assert len(interface._seen) == 1 and torch.allclose(halved.float(), first.float() / 2, rtol=1e-2, atol=1e-3)
    # what the checks refuse is refused on a repeat too: a gradient wanted, the descales of another layout
    with pytest.raises(NotImplementedError, match="forward only"):
        flashattn2.flash_attn_func(q8, k8, v8.requires_grad_(), causal=True, q_descale=qd, k_descale=kd,
                                   v_descale=vd)
    v8.requires_grad_(False)
    with pytest.raises(ValueError, match="q_descale must be float32 of shape"):
        flashattn2.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd[:, :1], k_descale=kd, v_descale=vd)
    with pytest.raises(NotImplementedError, match="dropout"):
        flashattn2.flash_attn_func(q8, k8, v8, dropout_p=0.1, q_descale=qd, k_descale=kd, v_descale=vd)
    with pytest.raises(NotImplementedError, match="dropout"):
        flashattn2.flash_attn_func(q8, k8, v8, dropout_p=0.1, q_descale=qd, k_descale=kd, v_descale=vd)
    assert len(interface._seen) == 1


def test_warmup_runs_every_variant():
    from flashattn2.warmup import warmup

    seconds = warmup(dtypes=("fp16",), head_dims=(32,), causal=(True,), nheads=2, nheads_k=1, seqlen=16,
                     device=DEVICE, verbose=False)
    assert seconds > 0


@pytest.mark.parametrize("arch,sm90a,tma,hopper,fp8", [
    ((9, 0), True, True, True, True), ((8, 9), False, False, False, True), ((8, 0), False, False, False, False),
    ((10, 0), False, True, False, True)])
def test_one_capability_rule_per_kernel_family(arch, sm90a, tma, hopper, fp8, monkeypatch):
    # kernels/common.py decides what each kernel family needs of a GPU; a CPU tensor has none of it
    from flashattn2.kernels import common

    monkeypatch.setattr(common, "capability", lambda index: arch)
    cuda = torch.device("cuda", 0)
    assert (common.runs_sm90a(cuda), common.has_tma(cuda), common.is_hopper_family(cuda)) == (sm90a, tma, hopper)
    assert (common.gpu_arch(cuda) >= common.FP8_MIN) == fp8
    cpu = torch.zeros(1)
    assert common.gpu_arch(cpu) is None
    assert not (common.runs_sm90a(cpu) or common.has_tma(cpu) or common.is_hopper_family(torch.device("cpu")))


def test_hopper_forward_tiles_for_short_calls(monkeypatch):
    # the Triton forward's tile table on Hopper: d64 causal calls of at most 4096 query rows take 64-row tiles of 4
    # warps walking their key tiles as one loop (measured faster at 512-4k), longer ones and the other head dims keep
    # the table's row
    from flashattn2.kernels import common
    from flashattn2.kernels.portable import configs

    monkeypatch.setattr(common, "capability", lambda index: (9, 0))
    monkeypatch.setattr(configs, "INTERPRET", False)
    cuda = torch.device("cuda", 0)
    long_d64 = configs.fwd_config(64, True, cuda, rows=4097)
    short_d64 = configs.FwdConfig(64, 64, 4, 3, one_loop=True)
    assert configs.fwd_config(64, True, cuda, rows=512) == short_d64 != long_d64
    assert configs.fwd_config(64, True, cuda, rows=4096) == short_d64
    assert long_d64 == configs.fwd_config(64, True, cuda) == configs.FwdConfig(128, 64, 8, 3)
    assert configs.fwd_config(32, True, cuda, rows=512) == short_d64
    assert configs.fwd_config(128, True, cuda, rows=512) == configs.fwd_config(128, True, cuda)
    assert configs.fwd_config(64, False, cuda, rows=512) == configs.fwd_config(64, False, cuda)
    # FP8 causal: 64-row tiles as one loop, with 128-key tiles at d64 from 1025 rows; d128 / d256 long calls keep
    # the table's row (auto runs them on Gluon)
    fp8 = dict(fp8=True)
    assert configs.fwd_config(64, True, cuda, rows=1024, **fp8) == configs.FwdConfig(64, 64, 4, 3, one_loop=True)
    assert configs.fwd_config(64, True, cuda, rows=1025, **fp8) == configs.FwdConfig(64, 128, 4, 3, one_loop=True)
    assert configs.fwd_config(64, True, cuda, **fp8) == configs.FwdConfig(64, 128, 4, 3, one_loop=True)
    assert configs.fwd_config(128, True, cuda, rows=2048, **fp8) == configs.FwdConfig(64, 64, 4, 3, one_loop=True)
    assert configs.fwd_config(128, True, cuda, rows=2049, **fp8) == configs.FwdConfig(128, 128, 8, 3)
    assert configs.fwd_config(256, True, cuda, rows=1024, **fp8) == configs.FwdConfig(64, 64, 4, 2, one_loop=True)
    assert configs.fwd_config(256, True, cuda, rows=1025, **fp8) == configs.FwdConfig(128, 64, 8, 2)
    # FP8 non-causal: 64-row tiles, 64 keys up to 512 rows at d64 and 1k at d128, then 128 (d256: 64 throughout)
    assert configs.fwd_config(64, False, cuda, rows=512, **fp8) == configs.FwdConfig(64, 64, 4, 3)
    assert configs.fwd_config(64, False, cuda, rows=513, **fp8) == configs.FwdConfig(64, 128, 4, 3)
    assert configs.fwd_config(64, False, cuda, **fp8) == configs.FwdConfig(64, 128, 4, 3)
    assert configs.fwd_config(128, False, cuda, rows=1024, **fp8) == configs.FwdConfig(64, 64, 4, 3)
    assert configs.fwd_config(128, False, cuda, rows=1025, **fp8) == configs.FwdConfig(64, 128, 4, 3)
    assert configs.fwd_config(256, False, cuda, rows=512, **fp8) == configs.FwdConfig(64, 64, 4, 3)
    assert configs.fwd_config(256, False, cuda, **fp8) == configs.FwdConfig(64, 64, 4, 3)
    # one key loop where it measured faster: d64 FP8 causal, d256 causal; not d128 causal nor long d64 causal
    assert configs.fwd_config(256, True, cuda).one_loop
    assert not (configs.fwd_config(128, True, cuda).one_loop or long_d64.one_loop)
    assert not any(configs.fwd_config(d, False, cuda).one_loop for d in (64, 128, 256))


# the compile child's snippet: every row of the Triton forward's Hopper tables compiled for sm_90 as a launch
# specialises it (scripts/kernel_resources.py), one line of resources a row
_ROWS_COMPILE = r"""
import sys
sys.path.insert(0, sys.argv[1])
from kernel_resources import forward_row_resources, forward_rows

for row in forward_rows():
    fp8, causal, d, cfg = row
    print(f"row fp8={int(fp8)} causal={int(causal)} d={d} {cfg}: {forward_row_resources(*row)}", flush=True)
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="compile-only check for CPU CI; the GPU runs the kernels")
def test_triton_forward_hopper_rows_compile_to_pipelined_wgmma(compile_child):
    # every tile row auto may give the Triton forward on Hopper: compiles for sm_90, its matmuls on wgmma (HGMMA for
    # bf16, QGMMA for FP8), its K / V loads through cp.async (LDGSTS: the key loop pipelined), and with the Triton the
    # GPU machines run (3.6) no spills
    import os
    import re

    import triton

    scripts = os.path.join(os.path.dirname(__file__), "..", "scripts")
    run = compile_child.run(_ROWS_COMPILE, [scripts])
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("row ")]
    assert len(rows) >= 15, run.stdout
    for row in rows:
        found = dict(re.findall(r"(stack|HGMMA|QGMMA|LDGSTS)\s+(\d+)", row))
        wgmma = found["QGMMA"] if "fp8=1" in row else found["HGMMA"]
        assert int(wgmma) > 0 and int(found["LDGSTS"]) > 0, row
        if triton.__version__.startswith("3.6."):
            assert found["stack"] == "0", row


def test_launch_leaves_out_options_a_kernel_lacks_and_names_unknown_arguments():
    # plans pass every AttnOptions.kernel_args() value; a kernel without one (no dropout, say) is launched
    # without it, while a name that is neither the kernel's nor an option is a mistake and raises
    import triton
    import triton.language as tl

    from flashattn2.kernels.params import OPTION_ARGS

    @triton.jit
    def kernel(X, n, BLOCK: tl.constexpr, HAS_LEFT: tl.constexpr):
        pass

    named = dict(AttnOptions(softmax_scale=1.0).kernel_args(), n=3, BLOCK=16)
    assert "dropout_p" in OPTION_ARGS and "HAS_LEFT" in OPTION_ARGS
    plan = launch.Launch(kernel, (1, 1, 1), (), named)
    assert plan.named == dict(n=3, BLOCK=16, HAS_LEFT=False)
    with pytest.raises(TypeError, match=r"\['BLOK'\]"):
        launch.Launch(kernel, (1, 1, 1), (), dict(named, BLOK=16))


@pytest.mark.parametrize("mode", ["dense", "causal", "varlen", "varlen-causal", "gqa", "fp8"])
def test_gluon_plans_bind_every_kernel_argument_on_cpu(mode, monkeypatch):
    # the Gluon kernels run on an H100 only, but their plans' host side (strides, descriptors, grid, argument
    # names) runs anywhere: launch records the call and binds it to the kernel's signature, as Triton would
    import inspect

    from flashattn2.kernels import common
    from flashattn2.kernels.sm90 import backward as bwd_sm90
    from flashattn2.kernels.sm90 import forward as fwd_sm90
    from flashattn2.kernels.sm90.common import TUPLE_STRIDES

    monkeypatch.setattr(common, "_index", lambda device: 0)
    monkeypatch.setattr(common, "_l2_bytes", lambda index: 50 << 20)
    props = type("Props", (), {"multi_processor_count": 132})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    bound = []

    def record(self, *tensors):
        signature = inspect.signature(self.kernel.fn)
        bound.append(signature.bind(*tensors, *self.scalars, **self.named).arguments)
        for name, length in TUPLE_STRIDES.items():  # the kernels unpack these tuples by their length
            assert name not in bound[-1] or len(bound[-1][name]) == length, name

    monkeypatch.setattr(launch.Launch, "__call__", record)
    torch.manual_seed(0)
    batch, seqlen, nheads, nheads_k, head_dim = 2, 96, 4, 2 if mode == "gqa" else 4, 128
    q = torch.randn(batch, seqlen, nheads, head_dim, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, seqlen, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    causal = mode.endswith("causal")
    opts = AttnOptions(softmax_scale=head_dim ** -0.5, window_left=-1, window_right=0 if causal else -1)
    descales = (None, None, None)
    if mode.startswith("varlen"):
        q, k, v = (x.flatten(0, 1) for x in (q, k, v))
        cu = torch.tensor([0, 40, 2 * seqlen], dtype=torch.int32)
        opts = opts._replace(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=seqlen + 56, max_seqlen_k=seqlen + 56)
    if mode == "fp8":
        q, k, v = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
        descales = tuple(torch.ones(batch, nheads_k) for _ in range(3))
        # the V transpose is a Triton kernel; its (batch, heads, head_dim, keys padded to 64) shape is enough here
        monkeypatch.setattr(fwd_sm90, "v_keys_last", lambda v, multiple, relabel: torch.zeros(
            v.shape[0], v.shape[2], v.shape[3], -(-v.shape[1] // multiple) * multiple, dtype=v.dtype))
    out, lse, _ = fwd_sm90.Sm90ForwardPlan(q, k, v, opts)(q, k, v, opts, descales)
    assert len(bound) == 1 and bound[0]["Lse"] is lse
    if mode == "causal":  # past MAX_SCHEDULED_ITEMS work items, one program per item and no schedule
        monkeypatch.setattr(fwd_sm90, "MAX_SCHEDULED_ITEMS", 7)
        fwd_sm90.Sm90ForwardPlan(q, k, v, opts)(q, k, v, opts, descales)
        assert bound.pop()["Schedule"] is None
    # a dense causal call's persistent grid takes a schedule table: offsets of its programs, then every item once
    # as (query block, batch, head)
    schedule = bound[0]["Schedule"]
    assert (schedule is not None) == (mode == "causal")
    if schedule is not None:
        programs = 8  # fewer items (8) than SMs
        placed = schedule[programs + 1:]  # tile_order.decoded_schedule's fields: block, batch, head
        items = sorted(zip(*(((placed >> 21 * i) & (1 << 21) - 1).tolist() for i in range(3)), strict=True))
        assert items == [(0, b, h) for b in range(batch) for h in range(nheads)] and schedule[programs] == 8
    if mode == "fp8":
        return
    dq_acc = torch.zeros(q.shape, dtype=torch.float32)
    bwd = bwd_sm90.Sm90Backward(out, q, k, v, lse, opts)
    bwd(out, q, k, v, lse, lse.clone(), dq_acc, torch.empty_like(k), torch.empty_like(v), opts)
    assert len(bound) == 2 and bound[1]["Lse"] is lse


@pytest.mark.parametrize("full_lists", [True, False])
def test_gluon_flex_forward_binds_every_kernel_argument_on_cpu(full_lists, monkeypatch):
    # flex_attention's Gluon forward (sm90/flex.py) runs on an H100 only; its host side (block lists, strides,
    # descriptors, the kernel's arguments) runs anywhere
    import inspect

    from torch.nn.attention.flex_attention import create_block_mask

    from flashattn2 import flex
    from flashattn2.kernels import common
    from flashattn2.kernels.sm90 import flex as flex_sm90
    from flashattn2.kernels.sm90.common import TUPLE_STRIDES

    monkeypatch.setattr(common, "_index", lambda device: 0)
    monkeypatch.setattr(common, "_l2_bytes", lambda index: 50 << 20)
    bound = []

    def record(self, *tensors):
        bound.append(inspect.signature(self.kernel.fn).bind(*tensors, *self.scalars, **self.named).arguments)
        for name, length in TUPLE_STRIDES.items():
            assert name not in bound[-1] or len(bound[-1][name]) == length, name

    monkeypatch.setattr(launch.Launch, "__call__", record)
    # the backward's Delta pass is a Triton kernel: on CPU tensors it runs under the interpreter only
    monkeypatch.setattr(flex_sm90, "row_deltas", lambda out, dout, dq_acc=None: torch.zeros(out.shape[:3]))
    batch, nheads, nheads_k, seqlen_q, seqlen_k, head_dim = 2, 4, 2, 256, 384, 128
    q = torch.randn(batch, nheads, seqlen_q, head_dim, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, nheads_k, seqlen_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    mask = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + 128, None, nheads, seqlen_q, seqlen_k,
                             device="cpu")
    if not full_lists:
        mask.full_kv_num_blocks = mask.full_kv_indices = None
    bits = flex._mask_bits(mask, seqlen_q, seqlen_k)
    out, lse = flex_sm90.flex_forward(q, k, v, mask, 0.1, bits[:2])
    args = bound[0]
    assert args["Lse"] is lse and args["stride_lse"] == (nheads * seqlen_q, seqlen_q)
    assert args["FullNum"].shape == args["KvNum"].shape == (batch, nheads, seqlen_q // 128)
    assert args["stride_idx"] == args["KvIndices"].stride()[:3] == args["FullIndices"].stride()[:3]
    if not full_lists:
        assert not args["FullNum"].any()
    # the backward over the mask's q view: dQ into an fp32 buffer the kernel's descriptor covers
    q_ids = bits[2]
    dq, dk, dv = flex_sm90.flex_backward(out, q, k, v, out, lse, mask, 0.1, bits[:2], q_ids)
    args = bound[1]
    assert args["Lse"] is lse and args["dK"] is dk and args["dV"] is dv and dq.shape == q.shape
    assert args["QNum"].shape == args["FullNum"].shape == (batch, nheads, seqlen_k // 128)
    assert args["stride_idx"] == args["QIndices"].stride()[:3] == args["PartialIds"].stride()[:3]
    assert args["stride_dk"] == dk.transpose(1, 2).stride()[:3]
    # the seams: whole blocks only
    monkeypatch.setattr(flex_sm90, "sm90_declines", lambda *a, **kw: None)
    for can in (flex_sm90.can_implement, flex_sm90.can_implement_backward):
        assert can(q, k, v, mask) is None
        assert "whole mask blocks" in can(q[:, :, :200], k, v, mask)
        small = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, None, None, seqlen_q, seqlen_k,
                                  device="cpu", BLOCK_SIZE=64)
        assert "BLOCK_SIZE" in can(q, k, v, small)
