"""One GPU run of the v4 two-stage MLA (192/128) backward prototype (mla_bwd_64row_2stage.py): launch, check,
time against the package's Gluon MLA backward kernel (sm90/backward.py, CONFIGS_MLA), the package's whole backward
and cuDNN's. On an H200 (torch 2.11, triton 3.6):

  TRITON_ALWAYS_COMPILE=1 PYTHONPATH=src:benchmarks/results/2026-11-28_prepared/mla_bwd_64row \\
      python3 benchmarks/results/2026-11-28_prepared/mla_bwd_64row/run_2stage.py --out $OUT/mla2

Writes OUT/results.json (after every stage) and OUT/results.md, prints both, exits 0 whatever happens. The work runs
in a child process that the parent kills after --deadline seconds, so that a kernel that never finishes (a barrier
waited on with the wrong phase) costs that much and no more; the child itself gives up on a launch that has not
finished after 20 s (60 s while timing) and writes down where.

The prototype runs the kernel compile_for_sm90(**V4) returns, the one of the README's v4 row (same signature, no
argument specialisation, `.minnctapersm 1` and no `.maxnreg` through one_cta_registers), launched with the argument
list mla_bwd_64row_2stage.launch_args builds; check_signature holds that list against the compiled signature first.

Stages: correctness (no timing unless every check passes): batch 2, 16 heads, seqlen 1024, 2048 and 1000 (a ragged
tail), causal, fresh torch.randn bf16 inputs. Reference: float64 PyTorch; a gradient passes when its max abs error
is at most 3x that of the same math in bf16 PyTorch, plus 1e-5 (flash_attn's rule). Checked: the prototype at three
grid sizes (one program per work item as the package launches causal MLA, one per SM, and 7 programs looping over
many items: the barrier phases across items), the package's kernel alone (its plan's preprocess, the kernel, dq_acc
to bf16) and the package's whole backward through autograd. dK, dV and the fp32 dQ buffer are NaN before each
launch (the preprocess zeroes the dQ buffer, as in the package; seqlen 1000 takes out, lse and Delta from the
float64 reference instead, to spare the package's kernels a recompile for an unaligned length).
Timing: seqlen 2048-16384 with batch = 16384 // seqlen, 16 heads, causal; CUDA events, 5 interleaved rounds
(alternating order), median: the prototype's kernel (one program per item; also a persistent grid of one program
per SM), the package's kernel alone, the package's backward via autograd, cuDNN's via SDPA (b, h, s, d).
The verdict line is the README's go/no-go: package kernel time / prototype time >= 1.05 at 2k.

--cpu-check (no GPU): compiles the prototype, builds the launch arguments on CPU tensors and checks them against the
compiled signature, checks the work-item arithmetic, and (in a child with TRITON_INTERPRET=1) the reference and the
pass rule against the package's portable backward in float16 at a tiny size.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
V4 = dict(NA=64, NB=0, STAGES=2, DO_STAGES=1, DS_BUFS=1, DQ_STAGE=0, SDP_SEQ=1, P_SMEM=1, DQ_SEQ=1, HAS_SOFTCAP=0,
          FREE_REGS=1, ONE_CTA=1)
README_V4 = dict(shared=230448, max_reg=237, ptxas_spill_bytes=(312, 460), step_stl_ldl=(14, 36))
HEADS, QK_DIM, V_DIM = 16, 192, 128
CHECK_SHAPES = ((2, 1024), (2, 2048), (2, 1000))  # (batch, seqlen); the unaligned one last (see the docstring)
TIME_SEQLENS = (2048, 4096, 8192, 16384)
TOKENS = 16384
ROUNDS = 5
DEVICE = "cuda"
SLACK = 1e-5
# column blocks of the prototype's outputs, for a failure's whereabouts: dQ by the warpgroup that adds it (chunk 0:
# warpgroup 0, columns 64-95: warpgroup 0's 32-column block, 96-127: warpgroup 1's, chunk 2: warpgroup 1), dKᵀ's
# three chunks, dVᵀ's two halves
BLOCKS = {"dq": ((0, 64), (64, 96), (96, 128), (128, 192)), "dk": ((0, 64), (64, 128), (128, 192)),
          "dv": ((0, 64), (64, 128))}


# ---------------------------------------------------------------------------------------------------------------
# references and errors


def causal_reference(q, k, v, do, scale, dtype):
    """(dq, dk, dv), out, lse (natural log) of causal attention (bottom-right aligned) in `dtype` PyTorch."""
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    sq, sk = q.shape[1], k.shape[1]
    rows = torch.arange(sq, device=q.device)[:, None]
    cols = torch.arange(sk, device=q.device)[None, :]
    s = s.masked_fill(cols > rows + (sk - sq), float("-inf"))
    p = torch.softmax(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    grads = torch.autograd.grad(out, (q, k, v), do.to(dtype))
    lse = torch.logsumexp(s.detach(), dim=-1)
    return grads, out.detach(), lse


def max_err(x, ref) -> float:
    """Max abs difference in float64; NaN anywhere counts as inf."""
    d = (x.detach().double() - ref.detach().double()).abs()
    return float(torch.nan_to_num(d, nan=float("inf")).max())


def judge(grads, ref, tol) -> dict:
    errs = {n: max_err(g, r) for n, g, r in zip(("dq", "dk", "dv"), grads, ref, strict=True)}
    nans = {n: int(torch.isnan(g).sum()) for n, g in zip(("dq", "dk", "dv"), grads, strict=True)}
    ok = all(errs[n] <= tol[n] and nans[n] == 0 for n in errs)
    return dict(ok=ok, err=errs, nan=nans)


def where(grads, ref) -> dict:
    """Per column block max errors, and the (batch, row, head, col) of each gradient's largest one."""
    out = {}
    for n, g, r in zip(("dq", "dk", "dv"), grads, ref, strict=True):
        d = torch.nan_to_num((g.double() - r.double()).abs(), nan=float("inf"))
        flat = int(d.argmax())
        idx = []
        for size in reversed(d.shape):
            idx.append(flat % size)
            flat //= size
        out[n] = dict(blocks={f"{a}-{b}": float(d[..., a:b].max()) for a, b in BLOCKS[n]}, argmax=idx[::-1])
        if n != "dq" and d.shape[1] % 128 == 0:  # keys by the consumer warpgroup that holds them (64 of each 128)
            out[n]["warpgroup_keys"] = [float(d.unflatten(1, (-1, 128))[:, :, 64 * h:64 * h + 64].max())
                                        for h in (0, 1)]
    return out


# ---------------------------------------------------------------------------------------------------------------
# the prototype's launch


def check_signature(ck, args) -> None:
    """The launch arguments' Triton types (and constexpr values) against the compiled kernel's signature: what
    Triton's launcher packs them by; a difference would run another kernel's argument layout."""
    import mla_bwd_64row_2stage as M
    from triton.runtime.jit import mangle_type

    names = M.mla_bwd_rows_kernel.arg_names
    bad = []
    for i, (name, value) in enumerate(zip(names, args, strict=True)):
        want = ck.src.signature[name]
        if want == "constexpr":
            have = ck.src.constants[(i,)]
            if have != value:
                bad.append(f"{name}: constexpr {have!r} compiled, {value!r} passed")
        elif str(mangle_type(value)).replace(" ", "") != str(want).replace(" ", ""):
            bad.append(f"{name}: {want} compiled, {mangle_type(value)} passed")
    if bad:
        raise TypeError("launch arguments unlike the compiled signature: " + "; ".join(bad))


class Proto:
    """The compiled prototype's launcher (triton's own, as Launch's fast path calls it)."""

    def __init__(self, ck):
        self.ck = ck
        ck._init_handles()  # loads the cubin, builds the launcher; raises if it cannot run here

    def __call__(self, args, grid: int) -> None:
        ck = self.ck
        ck.run(grid, 1, 1, torch.cuda.current_stream().cuda_stream, ck.function, ck.packed_metadata, None, None, None,
               *args)


# ---------------------------------------------------------------------------------------------------------------
# the child: every stage, results written after each


class Run:
    def __init__(self, out: str, budget: float):
        self.path = os.path.join(out, "results.json")
        self.t0 = time.time()
        self.budget = budget
        self.data = dict(flags=V4, readme_v4=README_V4, stages={}, failures=[], correctness=[], timing=[])

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)

    def stage(self, name, fn, *args):
        t = time.time()
        print(f"== {name} (at {t - self.t0:.0f} s)", flush=True)
        try:
            value, ok, error = fn(*args), True, None
        except Exception as exc:  # a compile, launch or check error: written down, the run goes on
            value, ok = None, False
            error = "".join(traceback.format_exception(exc))
            print(error, flush=True)
            self.data["failures"].append(f"{name}: {type(exc).__name__}: {str(exc)[:400]}")
        self.data["stages"][name] = dict(ok=ok, seconds=round(time.time() - t, 1),
                                         error=None if error is None else error[-4000:])
        self.save()
        return ok, value

    def wait(self, what: str, timeout: float) -> None:
        """Until the GPU is done, raising its error if any; past `timeout` the launch is taken for hung: written
        down, and the process ends (a hung kernel cannot be recovered from)."""
        event = torch.cuda.Event()
        event.record()
        t = time.time()
        while not event.query():
            if time.time() - t > timeout:
                self.data["hang"] = f"{what}: not finished after {timeout:.0f} s"
                self.data["failures"].append(self.data["hang"])
                self.save()
                print("HANG: " + self.data["hang"], flush=True)
                os._exit(3)
            time.sleep(0.0005)
        torch.cuda.synchronize()


def env_stage(run: Run) -> dict:
    import triton

    assert torch.cuda.is_available(), "no CUDA device"
    props = torch.cuda.get_device_properties(0)
    meta = dict(device=props.name, sms=props.multi_processor_count, capability=list(torch.cuda.get_device_capability()),
                torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(), date=time.strftime("%Y-%m-%d %H:%M"),
                always_compile=os.environ.get("TRITON_ALWAYS_COMPILE"),
                backend=os.environ.get("FLASHATTN2_BACKEND", "auto"))
    run.data["meta"] = meta
    assert meta["capability"] == [9, 0], f"not an sm_90 GPU: {meta['capability']}"
    return meta


def compile_stage(run: Run):
    import mla_bwd_64row_2stage as M

    ck = M.compile_for_sm90(**V4)  # under one_cta_registers; TRITON_ALWAYS_COMPILE=1: the hook is not in the key
    proto = Proto(ck)
    info = dict(shared=ck.metadata.shared, n_regs=ck.n_regs, n_spills=ck.n_spills, num_warps=ck.metadata.num_warps,
                minnctapersm=".minnctapersm 1" in ck.asm["ptx"], maxnreg_line=".maxnreg" in ck.asm["ptx"])
    info["shared_as_readme"] = info["shared"] == README_V4["shared"]
    run.data["prototype"] = info
    print(f"prototype: {info}", flush=True)
    return proto


def inputs(batch, seqlen, seed):
    torch.manual_seed(seed)
    q, k = (torch.randn(batch, seqlen, HEADS, QK_DIM, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    v, do = (torch.randn(batch, seqlen, HEADS, V_DIM, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    return q, k, v, do


def package_plan(q, k, v, do, out, lse):
    """The package's backward plan for this causal call (what flash_attn_func's backward makes), and its options;
    raises unless it takes the Gluon kernel with dQ fused."""
    from flashattn2.checks import attn_options
    from flashattn2.kernels import backends

    opts = attn_options(q, None, None, q.shape[1], k.shape[1], 0.0, None, True, (-1, -1), 0.0, None, False)
    plan = backends.backward_plan(do, q, k, v, out, lse, opts)
    if plan.gluon is None or not plan.fused_dq:
        raise RuntimeError(f"the package's backward does not take its Gluon kernel here: "
                           f"{backends.backward_backend(do, q, k, v, opts)}")
    return plan, opts


def preprocess(plan, opts, out, do, lse, q):
    """Delta and a zeroed fp32 dQ buffer as the package makes them (NaN first, so that an unzeroed row shows)."""
    delta = torch.full(lse.shape, float("nan"), dtype=torch.float32, device=DEVICE)
    dq_acc = torch.full(q.shape, float("nan"), dtype=torch.float32, device=DEVICE)
    plan.preprocess(out, do, delta, dq_acc, opts.cu_seqlens_q, None, None, None)
    return delta, dq_acc


def nan_like(x):
    return torch.full_like(x, float("nan"))


def check_shape(run: Run, proto, batch: int, seqlen: int, seed: int) -> dict:
    import mla_bwd_64row_2stage as M

    from flashattn2 import flash_attn_func

    q, k, v, do = inputs(batch, seqlen, seed)
    scale = QK_DIM ** -0.5
    ref, out64, lse64 = causal_reference(q, k, v, do, scale, torch.float64)
    pt, _, _ = causal_reference(q, k, v, do, scale, torch.bfloat16)
    pt_err = {n: max_err(g, r) for n, g, r in zip(("dq", "dk", "dv"), pt, ref, strict=True)}
    tol = {n: 3 * e + SLACK for n, e in pt_err.items()}
    row = dict(batch=batch, seqlen=seqlen, heads=HEADS, seed=seed, torch_bf16_err=pt_err, tol=tol, results={})
    print(f"-- check b{batch} s{seqlen}: tolerances {tol}", flush=True)
    del pt
    aligned = seqlen % 16 == 0
    if aligned:  # the package: forward, then its backward plan's preprocess for Delta and the dQ buffer
        with torch.no_grad():
            out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        row["package_lse_err"] = max_err(lse, lse64)
        row["package_out_err"] = max_err(out, out64)
        plan, opts = package_plan(q, k, v, do, out, lse)
        delta, _ = preprocess(plan, opts, out, do, lse, q)
    else:  # out, lse and Delta from the float64 reference
        out, lse = out64.to(torch.bfloat16), lse64.float().contiguous()
        delta = (do.double() * out64).sum(-1).transpose(1, 2).float().contiguous()
    # the prototype at three grid sizes
    proto_grads = None
    n_sm = run.data["meta"]["sms"]
    for label, grid_of in (("per_item", lambda n: n), ("per_sm", lambda n: min(n, n_sm)), ("7_programs", lambda n: 7)):
        name = f"prototype_{label}"
        try:
            dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=DEVICE) if not aligned else \
                preprocess(plan, opts, out, do, lse, q)[1]
            dk, dv = nan_like(k), nan_like(v)
            args, num_tiles = M.launch_args(q, k, v, do, dq_acc, lse, delta, dk, dv, scale, **V4)
            check_signature(proto.ck, args)
            grid = grid_of(num_tiles)
            proto(args, grid)
            run.wait(f"{name} b{batch} s{seqlen} grid {grid}", 20.0)
            grads = (dq_acc.to(torch.bfloat16), dk, dv)
            res = judge(grads, ref, tol)
            res.update(grid=grid, num_tiles=num_tiles)
            if not res["ok"]:
                res["where"] = where(grads, ref)
            elif label == "per_item":
                proto_grads = grads
        except Exception as exc:
            res = dict(ok=False, error=f"{type(exc).__name__}: {exc}")
            print(traceback.format_exc(), flush=True)
        row["results"][name] = res
        print(f"   {name}: {res}", flush=True)
        run.save()
    if aligned:
        # the package's kernel alone, as portable/backward.py runs it
        try:
            delta2, dq_acc = preprocess(plan, opts, out, do, lse, q)
            dk, dv = nan_like(k), nan_like(v)
            plan.gluon(do, q, k, v, lse, delta2, dq_acc, dk, dv, opts)
            run.wait(f"package kernel b{batch} s{seqlen}", 60.0)
            pkg = (dq_acc.to(q.dtype), dk, dv)
            res = judge(pkg, ref, tol)
            if proto_grads is not None:
                res["vs_prototype"] = {n: max_err(a, b) for n, a, b in zip(("dq", "dk", "dv"), pkg, proto_grads,
                                                                          strict=True)}
        except Exception as exc:
            res = dict(ok=False, error=f"{type(exc).__name__}: {exc}")
            print(traceback.format_exc(), flush=True)
        row["results"]["package_kernel"] = res
        print(f"   package_kernel: {res}", flush=True)
        # the package's whole backward through autograd (flash_attn_func)
        try:
            qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
            og = flash_attn_func(qg, kg, vg, causal=True)
            res = judge(torch.autograd.grad(og, (qg, kg, vg), do), ref, tol)
        except Exception as exc:
            res = dict(ok=False, error=f"{type(exc).__name__}: {exc}")
            print(traceback.format_exc(), flush=True)
        row["results"]["package_autograd"] = res
        print(f"   package_autograd: {res}", flush=True)
    run.data["correctness"].append(row)
    run.save()
    bad = [name for name, res in row["results"].items() if not res["ok"]]
    if bad:
        raise AssertionError(f"b{batch} s{seqlen}: failed {bad}")
    return row


def bench(run: Run, fns: dict, what: str) -> dict:
    """Median ms per call over ROUNDS interleaved rounds (alternating order), each about 30 ms of calls."""
    est = {}
    for name, fn in fns.items():
        fn()
        fn()
        run.wait(f"{what} {name} warm-up", 60.0)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        run.wait(f"{what} {name} estimate", 60.0)
        est[name] = max(3, min(50, math.ceil(30.0 / max(e0.elapsed_time(e1), 1e-3))))
    times = {name: [] for name in fns}
    for r in range(ROUNDS):
        for name in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            fn, n = fns[name], est[name]
            fn()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(n):
                fn()
            e1.record()
            run.wait(f"{what} {name} round {r}", 60.0)
            times[name].append(e0.elapsed_time(e1) / n)
    return {name: dict(median_ms=statistics.median(ts), min_ms=min(ts), ms=[round(t, 4) for t in ts], iters=est[name])
            for name, ts in times.items()}


def time_shape(run: Run, proto, seqlen: int) -> dict:
    import mla_bwd_64row_2stage as M
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashattn2 import flash_attn_func

    batch = TOKENS // seqlen
    q, k, v, do = inputs(batch, seqlen, 1000 + seqlen)
    scale = QK_DIM ** -0.5
    with torch.no_grad():
        out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    plan, opts = package_plan(q, k, v, do, out, lse)
    delta, dq_pkg = preprocess(plan, opts, out, do, lse, q)
    dk_pkg, dv_pkg = torch.empty_like(k), torch.empty_like(v)
    dq_proto = torch.zeros(q.shape, dtype=torch.float32, device=DEVICE)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    args, num_tiles = M.launch_args(q, k, v, do, dq_proto, lse, delta, dk, dv, scale, **V4)
    check_signature(proto.ck, args)
    n_sm = run.data["meta"]["sms"]
    fns = {"prototype": lambda: proto(args, num_tiles),
           "prototype_persistent": lambda: proto(args, min(num_tiles, n_sm)),
           "package_kernel": lambda: plan.gluon(do, q, k, v, lse, delta, dq_pkg, dk_pkg, dv_pkg, opts)}
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    og = flash_attn_func(qg, kg, vg, causal=True)
    fns["package_backward"] = lambda: torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True)
    row = dict(seqlen=seqlen, batch=batch, heads=HEADS, num_tiles=num_tiles,
               package_grid=list(plan.gluon.launch.grid), package_tuning={
                   k: v for k, v in plan.gluon.launch.named.items() if k.isupper() and isinstance(v, (bool, int))})
    try:
        qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        dot = do.transpose(1, 2).contiguous()
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            oc = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        fns["cudnn_backward"] = lambda: torch.autograd.grad(oc, (qt, kt, vt), dot, retain_graph=True)
    except RuntimeError as exc:  # cuDNN may refuse the shape: said, and left out
        row["cudnn_error"] = str(exc).splitlines()[0][:300]
    times = bench(run, fns, f"s{seqlen}")
    # causal FLOPs of the backward: 2.5x the forward's batch * heads * s^2 * (192 + 128) (half of 2 (d_qk + d_v))
    flop = 2.5 * batch * HEADS * seqlen * seqlen * (QK_DIM + V_DIM)
    for t in times.values():
        t["tflops"] = round(flop / t["median_ms"] / 1e9, 1)
    row["times"] = times
    row["package_over_prototype"] = round(times["package_kernel"]["median_ms"] / times["prototype"]["median_ms"], 4)
    row["package_over_prototype_persistent"] = round(
        times["package_kernel"]["median_ms"] / times["prototype_persistent"]["median_ms"], 4)
    print(f"-- s{seqlen}: " + ", ".join(f"{n} {t['median_ms']:.3f} ms" for n, t in times.items())
          + f"; package/prototype {row['package_over_prototype']}", flush=True)
    run.data["timing"].append(row)
    return row


def child(args) -> int:
    sys.path.insert(0, HERE)
    run = Run(args.out, args.budget)
    run.save()
    ok, _ = run.stage("environment", env_stage, run)
    if not ok:
        return 0
    ok, proto = run.stage("compile_prototype", compile_stage, run)
    if not ok:
        return 0
    correct = True
    for i, (batch, seqlen) in enumerate(CHECK_SHAPES):
        ok, _ = run.stage(f"check_b{batch}_s{seqlen}", check_shape, run, proto, batch, seqlen, 17 + i)
        correct = correct and ok
        torch.cuda.empty_cache()
    run.data["correct"] = correct
    if not correct:
        print("correctness failed: no timing", flush=True)
        run.data["verdict"] = "not timed: a correctness check failed"
        run.save()
        return 0
    for seqlen in TIME_SEQLENS:
        if time.time() - run.t0 > run.budget:
            run.data["failures"].append(f"time_s{seqlen}: skipped, past the {run.budget:.0f} s budget")
            continue
        run.stage(f"time_s{seqlen}", time_shape, run, proto, seqlen)
        torch.cuda.empty_cache()
    at_2k = [r for r in run.data["timing"] if r["seqlen"] == 2048]
    if at_2k:
        ratio = at_2k[0]["package_over_prototype"]
        run.data["verdict"] = (f"package kernel / prototype at 2k = {ratio:.3f}: "
                               + ("GO (>= 1.05)" if ratio >= 1.05 else "NO-GO (< 1.05): close the plan"))
    run.data["done"] = True
    run.save()
    return 0


# ---------------------------------------------------------------------------------------------------------------
# the parent: the child under a deadline, then the report


def report(data: dict) -> str:
    lines = ["# MLA backward v4 prototype: GPU run", ""]
    meta = data.get("meta", {})
    if meta:
        lines.append(f"{meta.get('device')} ({meta.get('sms')} SMs), torch {meta.get('torch')}, triton "
                     f"{meta.get('triton')}, cuDNN {meta.get('cudnn')}, {meta.get('date')}")
    lines.append(f"runner: {data.get('runner', {})}")
    if "prototype" in data:
        lines.append(f"prototype kernel: {data['prototype']}")
    lines += ["", "## Correctness (max abs error vs float64; pass: <= 3x bf16 PyTorch's + 1e-5)", "",
              "| shape | tolerance dq / dk / dv | candidate | grid | dq | dk | dv | pass |",
              "|---|---|---|---:|---:|---:|---:|---|"]
    for row in data.get("correctness", []):
        tol = " / ".join(f"{row['tol'][n]:.2e}" for n in ("dq", "dk", "dv"))
        for name, res in row["results"].items():
            errs = res.get("err", {})
            cells = " | ".join(f"{errs[n]:.2e}" if n in errs else "-" for n in ("dq", "dk", "dv"))
            failed = [n for n in errs if errs[n] > row["tol"][n] or res.get("nan", {}).get(n)]
            verdict = "yes" if res["ok"] else f"NO: {res['error'][:80]}" if "error" in res else f"NO: {failed}"
            lines.append(f"| b{row['batch']} s{row['seqlen']} | {tol} | {name} | {res.get('grid', '')} | {cells} | "
                         f"{verdict} |")
    if data.get("timing"):
        lines += ["", f"## Timing (median ms (TFLOP/s) of {ROUNDS} interleaved rounds; FLOPs: 2.5x the causal "
                  "forward's)", "",
                  "| seqlen x batch | prototype | prototype persistent | package kernel | package / prototype | "
                  "package backward | cuDNN backward |", "|---|---:|---:|---:|---:|---:|---:|"]
        for row in data["timing"]:
            t = row["times"]

            def cell(name, t=t):
                return f"{t[name]['median_ms']:.3f} ({t[name]['tflops']:.0f})" if name in t else "-"

            lines.append(f"| {row['seqlen']} x {row['batch']} | {cell('prototype')} | {cell('prototype_persistent')} "
                         f"| {cell('package_kernel')} | **{row['package_over_prototype']:.3f}** | "
                         f"{cell('package_backward')} | {cell('cudnn_backward')} |")
        lines += [f"- s{row['seqlen']}: cuDNN refused: {row['cudnn_error']}" for row in data["timing"]
                  if "cudnn_error" in row]
    lines += ["", f"verdict: {data.get('verdict', 'none')}"]
    if data.get("failures"):
        lines += ["", "failures:"] + [f"- {f}" for f in data["failures"]]
    return "\n".join(lines) + "\n"


def parent(args) -> int:
    t0 = time.time()
    path = os.path.join(args.out, "results.json")
    if os.path.exists(path):
        os.remove(path)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--out", args.out, "--budget", str(args.budget)]
    proc = subprocess.Popen(cmd)
    try:
        rc = proc.wait(timeout=args.deadline)
        status = f"child exited with {rc}"
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
        status = f"child killed after {args.deadline:.0f} s (hung or too slow)"
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            status += "; it did not exit within 30 s of SIGKILL"
    data = {}
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        data = dict(failures=[f"no readable results.json from the child: {exc}"])
    data["runner"] = dict(status=status, rc=rc, wall_s=round(time.time() - t0, 1))
    if rc != 0 or not data.get("done"):
        data.setdefault("failures", []).append(status + ("" if data.get("done") else " before the end of the run"))
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)
    text = report(data)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    print(json.dumps({k: v for k, v in data.items() if k not in ("correctness", "timing")}, indent=1, default=str))
    print(text, flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# --cpu-check: what can be checked without a GPU


def q_range(start_n, seqlen_q, seqlen_k, block_m, block_n):
    """device/block_range.q_range_for_kv_tile for a causal window (HAS_RIGHT, no left edge), on the host."""
    diag = seqlen_k - seqlen_q
    last_key = min(start_n + block_n, seqlen_k) - 1
    m_lo = min(max(start_n - diag, 0), seqlen_q) // block_m * block_m
    full_lo = -(-min(max(last_key - diag, 0), seqlen_q) // block_m) * block_m
    m_hi, full_hi = seqlen_q, -(-seqlen_q // block_m) * block_m
    if full_lo >= full_hi or start_n + block_n > seqlen_k:
        full_lo = full_hi = max(m_hi, m_lo)
    return m_lo, full_lo, full_hi, m_hi


def cpu_check(args) -> int:
    import mla_bwd_64row_2stage as M

    t = time.time()
    ck = M.compile_for_sm90(**V4)
    print(f"compiled in {time.time() - t:.0f} s: shared {ck.metadata.shared} (README {README_V4['shared']}), "
          f"minnctapersm {'.minnctapersm 1' in ck.asm['ptx']}, .maxnreg {'.maxnreg' in ck.asm['ptx']}")
    assert ck.metadata.shared == README_V4["shared"]
    for batch, seqlen in CHECK_SHAPES + tuple((TOKENS // s, s) for s in TIME_SEQLENS):
        q = torch.empty(batch, seqlen, HEADS, QK_DIM, dtype=torch.bfloat16)
        k = torch.empty_like(q)
        v = torch.empty(batch, seqlen, HEADS, V_DIM, dtype=torch.bfloat16)
        lse = torch.empty(batch, HEADS, seqlen)
        args_, num_tiles = M.launch_args(q, k, v, torch.empty_like(v), torch.zeros(q.shape), lse,
                                         torch.empty_like(lse), torch.empty_like(k), torch.empty_like(v),
                                         QK_DIM ** -0.5, **V4)
        check_signature(ck, args_)
        assert num_tiles == math.ceil(seqlen / 128) * batch * HEADS
        named = dict(zip(M.mla_bwd_rows_kernel.arg_names, args_, strict=True))
        assert named["stride_dk"] == (seqlen * HEADS * QK_DIM, HEADS * QK_DIM, QK_DIM)
        assert named["stride_dv"] == (seqlen * HEADS * V_DIM, HEADS * V_DIM, V_DIM)
        assert named["stride_lse"] == (HEADS * seqlen, seqlen)
        assert [list(named[n].block_shape) for n in ("q_desc", "ka_desc", "va_desc", "do_desc", "dq64_desc",
                                                     "dq32_desc")] == [[1, 64, 1, 64], [1, 64, 1, 64],
                                                                       [1, 64, 1, 128], [1, 64, 1, 128],
                                                                       [1, 64, 1, 64], [1, 64, 1, 32]]
        # every item: the producer's steps (m_lo..m_hi) are the consumers' three ranges; each row is visited by
        # exactly the key tiles that hold a key it sees
        steps = 0
        seen = [0] * seqlen
        for tile in range(num_tiles // (batch * HEADS)):
            start_n = tile * 128
            m_lo, full_lo, full_hi, m_hi = q_range(start_n, seqlen, seqlen, 64, 128)
            producer = list(range(m_lo, m_hi, 64))
            consumer = [m for a, b in ((m_lo, full_lo), (full_lo, full_hi), (full_hi, m_hi)) for m in range(a, b, 64)]
            assert producer == consumer, (seqlen, start_n, producer, consumer)
            steps += len(producer)
            for m in producer:
                for row in range(m, min(m + 64, seqlen)):
                    seen[row] += 1
        assert seen == [row // 128 + 1 for row in range(seqlen)], seqlen
        print(f"b{batch} s{seqlen}: signature ok, {num_tiles} items, {steps} steps per (batch, head), ranges ok")
    # the reference and the pass rule against the package's portable backward (interpreter, float16, tiny)
    # (with the installed Triton: an older one on PYTHONPATH for the sm_90 compile may not interpret)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if not os.path.isdir(os.path.join(p, "triton"))]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(paths))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--cpu-reference", "--out", args.out], env=env)
    print("cpu reference check:", "ok" if r.returncode == 0 else f"FAILED ({r.returncode})")
    return r.returncode


def cpu_reference() -> int:
    """Under TRITON_INTERPRET=1: the package's backward (portable kernels) at 192/128, float16, tiny causal shapes,
    judged by the rule the GPU run uses; and a gradient broken on purpose must fail it."""
    from flashattn2 import flash_attn_func

    for batch, seqlen, heads in ((1, 80, 2), (2, 33, 1)):
        torch.manual_seed(seqlen)
        q, k = (torch.randn(batch, seqlen, heads, QK_DIM, dtype=torch.float16) for _ in range(2))
        v, do = (torch.randn(batch, seqlen, heads, V_DIM, dtype=torch.float16) for _ in range(2))
        scale = QK_DIM ** -0.5
        ref, out64, lse64 = causal_reference(q, k, v, do, scale, torch.float64)
        pt, _, _ = causal_reference(q, k, v, do, scale, torch.float16)
        tol = {n: 3 * max_err(g, r) + SLACK for n, g, r in zip(("dq", "dk", "dv"), pt, ref, strict=True)}
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        out, lse, _ = flash_attn_func(qg, kg, vg, causal=True, return_attn_probs=True)
        res = judge(torch.autograd.grad(out, (qg, kg, vg), do), ref, tol)
        print(f"b{batch} s{seqlen} h{heads}: package {res}, lse err {max_err(lse, lse64):.1e}, "
              f"out err {max_err(out, out64):.1e}, tol {tol}")
        broken = list(pt)
        broken[1] = broken[1].clone()
        broken[1][0, -1, 0, 5] += 1.0  # the last key's dK: one element
        assert res["ok"] and not judge(broken, ref, tol)["ok"]
        print("   where():", where(broken, ref)["dk"])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=200.0, help="seconds after which the child is killed")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds after which timing shapes are skipped")
    ap.add_argument("--cpu-check", action="store_true", help="the checks that need no GPU")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cpu-reference", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sys.path.insert(0, HERE)
    if args.cpu_reference:
        return cpu_reference()
    if args.cpu_check:
        return cpu_check(args)
    if args.child:
        return child(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
