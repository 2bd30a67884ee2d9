"""python benchmarks/bench_overhead.py: host time per call at a small shape, and start-up costs.

Per-call time is measured as a training loop sees it: back-to-back calls, no cache flush, wall time
over many calls after a warm-up, synchronised once at each end. At b=1, seqlen 128, one head the GPU
work is a few microseconds, so this is the host time of the call (checks, autograd, launches).
Start-up runs fresh interpreters: `import flashattn2` on top of `import torch`, and the first call
of an option set with an empty and with a warm Triton cache.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SDPA_PEERS = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}


def _case(name: str, batch=1, seqlen=128, nheads=1, nheads_k=1, headdim=64, dtype=torch.bfloat16, device="cuda"):
    """(name, ours(q, k, v), sdpa(q, k, v), inputs in our layout, inputs in SDPA's) for one option set."""
    import flashattn2 as fa

    def rand(*shape):
        return torch.randn(*shape, dtype=dtype, device=device, requires_grad=True)

    q, k, v = rand(batch, seqlen, nheads, headdim), rand(batch, seqlen, nheads_k, headdim), \
        rand(batch, seqlen, nheads_k, headdim)
    gqa = nheads != nheads_k
    cu = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device=device)
    ours = {
        "plain": lambda q, k, v: fa.flash_attn_func(q, k, v),
        "causal": lambda q, k, v: fa.flash_attn_func(q, k, v, causal=True),
        "window": lambda q, k, v: fa.flash_attn_func(q, k, v, window_size=(32, 0)),
        "gqa": lambda q, k, v: fa.flash_attn_func(q, k, v, causal=True),
        "qkvpacked": lambda qkv: fa.flash_attn_qkvpacked_func(qkv, causal=True),
        "kvpacked": lambda q, kv: fa.flash_attn_kvpacked_func(q, kv, causal=True),
        "varlen": lambda q, k, v: fa.flash_attn_varlen_func(q, k, v, cu, cu, seqlen, seqlen, causal=True),
    }[name]
    if name == "qkvpacked":
        leaves = [torch.stack([q, k, v], dim=2).detach().requires_grad_()]
    elif name == "kvpacked":
        leaves = [q, torch.stack([k, v], dim=2).detach().requires_grad_()]
    elif name == "varlen":
        leaves = [x.detach().flatten(0, 1).requires_grad_() for x in (q, k, v)]
    else:
        leaves = [q, k, v]
    sdpa_inputs = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
    # the window has no SDPA-flash form: its peer is plain causal attention of the same size
    causal = name != "plain"
    return ours, leaves, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa), \
        sdpa_inputs


def _stepper(fn: Callable[..., torch.Tensor], leaves: list[torch.Tensor], backward: bool) -> Callable[[], None]:
    """One call of fn(*leaves), with its backward when asked."""
    dout = torch.randn_like(fn(*leaves))

    def step():
        out = fn(*leaves)
        if backward:
            for x in leaves:
                x.grad = None
            out.backward(dout)

    return step


def _block_us(step: Callable[[], None], backend, iters: int) -> float:
    # SDPA's backend is chosen around the block, not per call, so the choice costs no call anything
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def per_call_us(steps: dict[str, tuple], iters: int, repeats: int) -> dict[str, float]:
    """Median over `repeats` rounds of the mean wall time of `iters` back-to-back calls (microseconds) of
    each (SDPA backend or None, step); the steps take turns within a round, so a slow spell of the
    machine hits them alike."""
    for backend, step in steps.values():
        _block_us(step, backend, 20)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, (backend, step) in steps.items():
            times[name].append(_block_us(step, backend, iters))
    return {name: statistics.median(t) for name, t in times.items()}


def host_overhead(cases=("plain", "causal", "window", "gqa", "qkvpacked", "kvpacked", "varlen"), iters=300,
                  repeats=7) -> list[dict]:
    rows = []
    for name in cases:
        shape = dict(nheads=4, nheads_k=1) if name == "gqa" else {}
        ours, leaves, sdpa, sdpa_inputs = _case(name, **shape)
        row = {"case": name}
        for mode, backward in (("fwd", False), ("fwd_bwd", True)):
            steps = {"flashattn2": (None, _stepper(ours, leaves, backward))}
            for peer, backend in SDPA_PEERS.items():
                try:
                    with sdpa_kernel(backend):
                        steps[peer] = (backend, _stepper(sdpa, sdpa_inputs, backward))
                except RuntimeError as exc:
                    row.setdefault("notes", {})[f"{peer}_{mode}"] = str(exc).splitlines()[0][:200]
            for impl, us in per_call_us(steps, iters, repeats).items():
                row[f"{impl}_{mode}"] = us
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ------------------------------------------------------------------------------------------- start-up

_IMPORT = """
import json, time
t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); import flashattn2; t2 = time.perf_counter()
print(json.dumps({"torch_s": t1 - t0, "flashattn2_s": t2 - t1}))
"""

_FIRST_CALLS = """
import json, time, torch
t0 = time.perf_counter(); import flashattn2; t_import = time.perf_counter() - t0
q, k, v = (torch.randn(2, 1024, 8, HDIM, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
torch.cuda.synchronize()
def first(**kw):
    t0 = time.perf_counter(); out = flashattn2.flash_attn_func(q, k, v, **kw); torch.cuda.synchronize()
    t1 = time.perf_counter(); out.sum().backward(); torch.cuda.synchronize()
    return t1 - t0, time.perf_counter() - t1
fwd, bwd = first(causal=True)
fwd2, bwd2 = first(causal=False)
print(json.dumps({"import_s": t_import, "first_fwd_s": fwd, "first_bwd_s": bwd, "next_option_set_fwd_s": fwd2,
                  "next_option_set_bwd_s": bwd2}))
"""


def _run_python(code: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def startup(hdim: int = 128, runs: int = 3) -> dict:
    env = dict(os.environ)
    imports = [_run_python(_IMPORT, env) for _ in range(runs)]
    result = {"import_torch_s": statistics.median(r["torch_s"] for r in imports),
              "import_flashattn2_s": statistics.median(r["flashattn2_s"] for r in imports)}
    code = _FIRST_CALLS.replace("HDIM", str(hdim))
    with tempfile.TemporaryDirectory(prefix="flashattn2-cold-") as cache:
        env["TRITON_CACHE_DIR"] = cache
        result["cold_cache"] = _run_python(code, env)  # nothing compiled yet, not even Triton's helpers
        result["warm_cache"] = _run_python(code, env)  # the same cache, now filled
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_overhead.py", description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default="benchmarks/results")
    p.add_argument("--tag", help="file name stem (default YYYY-MM-DD_<device>_overhead)")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-startup", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from flashattn2.bench import collect_meta, default_stem

    meta = collect_meta(torch.cuda.get_device_name(), argv, {"command": "python benchmarks/bench_overhead.py"})
    rows = host_overhead(iters=args.iters, repeats=args.repeats)
    start = None if args.no_startup else startup()
    stem = args.tag or default_stem(torch.cuda.get_device_name()) + "_overhead"
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "startup": start}, indent=1))
    print(f"wrote {out / stem}.json (markdown and PNG: python benchmarks/report_overhead.py {out / stem}.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
