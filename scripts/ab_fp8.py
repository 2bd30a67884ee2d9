"""FP8 forward as flash_attn_func runs it, timed over the benchmark's grid (16k tokens per batch, hidden
2048), one JSON row per shape: run it once per source tree, alternating, for a same-machine A/B:

    PYTHONPATH=src python scripts/ab_fp8.py --tag B --out DIR
    python scripts/ab_fp8.py --summary DIR   # each shape's runs, and each tag's mean over A's

--set KEY=VALUE (repeatable) overrides that key of every Gluon FP8 tuning (fwd_sm90.CONFIGS_FP8); --set-causal
KEY=VALUE that of every causal call's changes (CONFIGS_FP8_CAUSAL), which apply over CONFIGS_FP8; --bf16 times the
bf16 forward on the same grid instead (--set then overrides fwd_sm90.CONFIGS, --set-causal CONFIGS_CAUSAL), for
changes both kernels share. FLASHATTN2_BACKEND=gluon keeps the calls that "auto" would give Triton on Gluon.
Rows of FP8 calls on Gluon say whether V was transposed in the kernel (v_transpose: --set V_TRANSPOSE=1 asks for it
at every length, --set V_TRANSPOSE_ROWS=0 for none, fwd_sm90.v_transpose_declines says where it cannot apply), e.g.
the keys-last copy against the transpose, both orders, at 512-16k:

    S="--seqlens 512 1024 2048 4096 8192 16384 --out /tmp/ab_vt"
    for t in A B B A; do FLASHATTN2_BACKEND=gluon PYTHONPATH=src python scripts/ab_fp8.py --tag $t $S --head-dims \
        128 256 $([ $t = B ] && echo --set V_TRANSPOSE=1 || echo --set V_TRANSPOSE_ROWS=0); done
    python scripts/ab_fp8.py --summary /tmp/ab_vt
"""

import argparse
import json
from functools import partial
from pathlib import Path

import torch
import triton.testing

from flashattn2 import attention_backend, flash_attn_func, quantize_fp8
from flashattn2.kernels import backends


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--summary", type=Path)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--set-causal", action="append", default=[])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--write", type=Path, help="with --summary: STEM.json, STEM.md and STEM.png of the runs")
    parser.add_argument("--about", default="", help="with --write: the device, versions and date of the runs")
    args = parser.parse_args()
    if args.summary:
        return summary(args.summary, "bf16" if args.bf16 else "fp8", args.write, args.about)
    from flashattn2.kernels.sm90 import forward as fwd_sm90

    for items, table in ((args.set, "CONFIGS" if args.bf16 else "CONFIGS_FP8"),
                         (args.set_causal, "CONFIGS_CAUSAL" if args.bf16 else "CONFIGS_FP8_CAUSAL")):
        for item in items:
            key, value = item.split("=")
            for tuning in getattr(fwd_sm90, table).values():
                tuning[key] = int(value)
    rows = []
    for head_dim in args.head_dims:
        for causal in (False, True):
            for seqlen in args.seqlens:
                torch.manual_seed(0)
                shape = (16384 // seqlen, seqlen, 2048 // head_dim, head_dim)
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                if args.bf16:
                    q8, k8, v8 = q, k, v
                    call = partial(flash_attn_func, q, k, v, causal=causal)
                else:
                    q8, k8, v8, qd, kd, vd = quantize_fp8(q, k, v)
                    call = partial(flash_attn_func, q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd,
                                   v_descale=vd)
                with torch.no_grad():
                    ms = triton.testing.do_bench(call, warmup=100, rep=400)
                flops = 4 * 16384 * seqlen * 2048 / (2 if causal else 1)
                row = {"tag": args.tag, "head_dim": head_dim, "causal": causal, "seqlen": seqlen,
                       "tflops": flops / ms / 1e9, "backend": attention_backend(q8, k8, v8, causal=causal).forward}
                plans = [p for p in backends._plans.values() if getattr(p, "fp8", False)]  # this shape's: the last
                if plans and not args.bf16 and row["backend"] == "gluon":  # the Triton kernel has no such plan
                    row["v_transpose"] = getattr(plans[-1], "v_transpose", None)
                print(json.dumps(row), flush=True)
                rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"ab_{'bf16' if args.bf16 else 'fp8'}_{args.tag}.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def summary(folder: Path, kind: str = "fp8", write: Path | None = None, about: str = "") -> None:
    """Each shape's TFLOP/s by tag and each tag's mean over A's; with write, the same as a result set (JSON, a
    markdown table, a PNG of the ratios)."""
    runs: dict = {}
    rows = []
    for path in sorted(folder.glob(f"ab_{kind}_*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            rows.append(r)
            runs.setdefault((r["head_dim"], r["causal"], r["seqlen"]), {}).setdefault(r["tag"], []).append(r["tflops"])
    lines = []
    ratios_by_cell: dict = {}
    for (head_dim, causal, seqlen), tags in sorted(runs.items()):
        mean = {t: sum(v) / len(v) for t, v in tags.items()}
        cells = "  ".join(f"{t} " + "/".join(f"{x:.0f}" for x in v) for t, v in sorted(tags.items()))
        ratios = "  ".join(f"{t}/A {mean[t] / mean['A']:.3f}" for t in sorted(mean) if t != "A" and "A" in mean)
        for t in sorted(mean):
            if t != "A" and "A" in mean:
                ratios_by_cell.setdefault((head_dim, causal, t), []).append((seqlen, mean[t] / mean["A"]))
        lines.append(f"d{head_dim} {'causal' if causal else 'full  '} {seqlen:>6}  {cells}  {ratios}")
        print(lines[-1])
    if write is None:
        return
    write.parent.mkdir(parents=True, exist_ok=True)
    write.with_suffix(".json").write_text(json.dumps({"about": about, "kind": kind, "rows": rows}, indent=1) + "\n")
    write.with_suffix(".md").write_text(f"# {kind} A/B ({folder.name})\n\n{about}\n\nTFLOP/s of each run by tag "
                                        "(tag/A: the means' ratio)\n\n```\n" + "\n".join(lines) + "\n```\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (head_dim, causal, tag), points in sorted(ratios_by_cell.items()):
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, marker="o", label=f"d{head_dim} {'causal' if causal else 'full'} {tag}/A")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("seqlen (16k tokens a batch)")
    ax.set_ylabel("TFLOP/s over A's")
    ax.set_title(about[:90], fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(write.with_suffix(".png"), dpi=80)


if __name__ == "__main__":
    main()
