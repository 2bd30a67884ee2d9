"""The main job: check the kernels against the float64 reference on a few shapes, then, on a CUDA GPU,
print a speed table against PyTorch's attention.

    python -m flashattn2 [--help]

On a CUDA GPU the table compares against SDPA's FLASH_ATTENTION, CUDNN_ATTENTION and
EFFICIENT_ATTENTION backends and plain PyTorch. Without one it checks small shapes through the Triton
interpreter on the CPU, says so, and prints no timings (they would measure the interpreter).
"""

import argparse
import os
import sys

import torch


def _reexec_under_interpreter() -> None:
    # Triton reads TRITON_INTERPRET when the kernels are decorated, i.e. when flashattn2 was imported
    # (python -m imports the package before this module), so the setting needs a fresh process.
    os.environ["TRITON_INTERPRET"] = "1"
    os.execv(sys.executable, [sys.executable, "-m", "flashattn2", *sys.argv[1:]])


def check_shapes(on_gpu: bool) -> list[tuple[int, int, int, int, int, int, bool, torch.dtype]]:
    """(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, causal, dtype) to verify."""
    if on_gpu:
        return [(2, 2048, 2048, 8, 8, 128, False, torch.bfloat16),
                (2, 2048, 2048, 8, 8, 128, True, torch.bfloat16),
                (2, 1000, 1537, 8, 2, 64, True, torch.float16),
                (1, 4096, 4096, 4, 1, 256, True, torch.bfloat16)]
    return [(1, 128, 128, 2, 2, 64, False, torch.bfloat16), (1, 77, 130, 4, 2, 40, True, torch.float16)]


def run_checks(device: str) -> bool:
    from flashattn2 import flash_attn_func
    from flashattn2.reference import attention_ref, within_tolerance

    print(f"correctness against the float64 reference ({device}); pass rule: error <= 2x (forward) or 3x "
          "(gradients) that of PyTorch in the input dtype")
    all_ok = True
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape, dtype):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    for shape in check_shapes(device == "cuda"):
        batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, causal, dtype = shape
        q = rand(batch, seqlen_q, nheads, head_dim, dtype=dtype).requires_grad_()
        k, v = (rand(batch, seqlen_k, nheads_k, head_dim, dtype=dtype).requires_grad_() for _ in range(2))
        dout = rand(batch, seqlen_q, nheads, head_dim, dtype=dtype)
        out = flash_attn_func(q, k, v, causal=causal)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        results = []
        for upcast in (True, False):
            leaves = [(x.detach().double() if upcast else x.detach()).requires_grad_() for x in (q, k, v)]
            ref_out, _ = attention_ref(*leaves, causal=causal, upcast=upcast)
            results.append((ref_out, torch.autograd.grad(ref_out, leaves, dout.to(ref_out.dtype))))
        (ref_out, ref_grads), (pt_out, pt_grads) = results
        line = []
        checks = [("out", out, ref_out, pt_out, 2.0)] + [
            (name, g, r, p, 3.0)
            for name, g, r, p in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads, strict=True)]
        for name, ours, ref, pt, factor in checks:
            ok, err, pt_err = within_tolerance(ours, ref, pt, factor)
            all_ok &= ok
            line.append(f"{name} {err:.1e}/{pt_err:.1e}{'' if ok else ' FAIL'}")
        print(f"  b={batch} sq={seqlen_q} sk={seqlen_k} h={nheads}/{nheads_k} d={head_dim} "
              f"{'causal' if causal else 'full  '} {str(dtype)[6:]:8s} max error ours/pytorch: "
              + ", ".join(line))
    print("  all checks passed" if all_ok else "  SOME CHECKS FAILED")
    return all_ok


def run_speed_table() -> None:
    from flashattn2.bench import make_shapes, markdown_table, run_suite

    print(f"\nspeed on {torch.cuda.get_device_name()} (TFLOP/s, bf16, 16k tokens, hidden 2048; "
          "the full benchmark is python -m flashattn2.bench):")
    shapes = make_shapes(seqlens=[1024, 4096], hdims=[64, 128], dtypes=["bf16"])
    rows = run_suite(shapes, ["fwd", "bwd"], None, "cuda", warmup_ms=10, rep_ms=40)
    print(markdown_table(rows))


CPU_NEXT = """
no CUDA GPU: the kernels ran through the Triton interpreter on the CPU (TRITON_INTERPRET=1), forward and
backward, on the shapes above; timings there would measure the interpreter, so none are printed.
Next: the tests (python -m pytest -q -n 2, the same interpreter), or this command on a CUDA GPU for a speed
table against PyTorch's attention, and python -m flashattn2.bench for the full benchmark."""


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m flashattn2",
        description="Check flashattn2's kernels (forward and backward) against a float64 reference on a few "
                    "shapes; on a CUDA GPU, then time them against PyTorch's attention backends. Without a GPU "
                    "the check runs through the Triton interpreter on the CPU (slow, small shapes, no timings).",
    ).parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        _reexec_under_interpreter()
    ok = run_checks("cuda" if on_gpu else "cpu")
    if on_gpu:
        run_speed_table()
    else:
        print(CPU_NEXT)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
