"""Train a GPT-style model with each attention backend from the same seed and data; report tokens/s, model
TFLOP/s, MFU, peak memory and the loss curves.

    python examples/gpt/train.py --config gpt-1.3b --seqlen 2048 --steps 60    # one GPU
    python examples/gpt/train.py --config tiny --steps 20 --device cpu --no-compile   # a minute, no GPU

Writes <out-dir>/<date>_<device>_gpt_<config>_s<seqlen>.json, .md and .png.
"""

import argparse
import contextlib
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from data import MemmapStream, SyntheticStream  # noqa: E402
from model import BACKENDS, CONFIGS, GPT, GPTConfig  # noqa: E402

# dense bf16 tensor-core peaks (TFLOP/s) by device name, for MFU; --peak-tflops overrides
PEAKS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAKS.items() if k in name), None)


def _activated(backend: str):
    """flashattn2 as SDPA's FLASH_ATTENTION kernels for the sdpa-flashattn2 run (torch's own are restored after)."""
    if backend != "sdpa-flashattn2":
        return contextlib.nullcontext()
    from flashattn2.sdpa_backend import sdpa_flash_backend

    return sdpa_flash_backend()


def train(backend: str, cfg: GPTConfig, args, batches: list[torch.Tensor], device: torch.device) -> dict:
    torch.manual_seed(args.seed)
    model = GPT(cfg, backend).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    if args.compile:
        # block by block: the 24 blocks share one compiled graph (parameters are its inputs), compiled once
        for block in model.blocks:
            block.compile()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = [], []
    for step, batch in enumerate(batches):
        batch = batch.to(device, non_blocking=True)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # one sync per step: the step's time includes all its work
        times.append(time.perf_counter() - t0)
        if step % args.log_every == 0 or step == len(batches) - 1:
            print(f"{backend:11s} step {step:4d}  loss {losses[-1]:.4f}  {times[-1] * 1e3:8.1f} ms", flush=True)
    timed = times[args.warmup:] or times
    tokens = batches[0].shape[0] * (batches[0].shape[1] - 1)
    tok_s = tokens * len(timed) / sum(timed)
    tflops = tok_s * model.flops_per_token(args.seqlen) / 1e12
    peak = peak_tflops(device, args.peak_tflops)
    return {"backend": backend, "tokens_per_s": tok_s, "model_tflops": tflops,
            "mfu": tflops / peak if peak else None, "final_loss": losses[-1], "losses": losses,
            "last10_loss": sum(losses[-10:]) / len(losses[-10:]),
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}


def write(results: list[dict], meta: dict, out_dir: Path, stem: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lines = [f"# GPT training: {meta['config']}, seqlen {meta['seqlen']}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()] + ["", "| backend | tokens/s | model TFLOP/s | MFU | peak GiB | "
              f"loss after {meta['steps']} steps | mean loss, last 10 steps | tokens/s vs sdpa-flash |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    flash = next((r["tokens_per_s"] for r in results if r["backend"] == "sdpa-flash" and "error" not in r), None)
    for r in results:
        if "error" in r:
            lines.append(f"| {r['backend']} | failed: {r['error']} | | | | | | |")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] else "n/a"
        mem = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else "n/a"
        ratio = f"{r['tokens_per_s'] / flash:.3f}" if flash else "n/a"
        lines.append(f"| {r['backend']} | {r['tokens_per_s']:.0f} | {r['model_tflops']:.1f} | {mfu} | {mem} | "
                     f"{r['final_loss']:.4f} | {r['last10_loss']:.4f} | {ratio} |")
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for r in results:
            if "losses" in r:
                ax.plot(r["losses"], label=r["backend"])
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.set_title(f"{meta['config']}, seqlen {meta['seqlen']}, {meta['device']}", fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / f"{stem}.png", dpi=110)
    except ImportError:
        print("matplotlib missing: no PNG (pip install matplotlib)", file=sys.stderr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=list(CONFIGS), default="gpt-125m")
    p.add_argument("--seqlen", type=int, default=2048)
    p.add_argument("--batch-tokens", type=int, default=16384, help="tokens per step (batch = this / seqlen)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the timing (compilation)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--backends", nargs="+", default=["flashattn2", "sdpa-flash", "sdpa-cudnn"], choices=BACKENDS)
    p.add_argument("--data", default=None, help="a numpy memmap of token ids (default: a synthetic stream)")
    p.add_argument("--data-dtype", default="uint16")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--device", default="cuda")
    p.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, for MFU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--out-dir", default="benchmarks/results")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    cfg = GPTConfig(**CONFIGS[args.config], max_seqlen=args.seqlen)
    stream = (MemmapStream(args.data, cfg.vocab_size, args.data_dtype, args.seed) if args.data
              else SyntheticStream(cfg.vocab_size, args.seed))
    batch = max(1, args.batch_tokens // args.seqlen)
    batches = [stream.batch(batch, args.seqlen) for _ in range(args.steps)]  # the same data for every backend
    results = []
    for backend in args.backends:
        try:
            with _activated(backend):
                results.append(train(backend, cfg, args, batches, device))
        except Exception as exc:  # a backend that refuses the shape is a result
            results.append({"backend": backend, "error": str(exc).splitlines()[0][:200]})
            print(f"{backend}: failed: {results[-1]['error']}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    meta = {"config": args.config, "seqlen": args.seqlen, "batch": batch, "steps": args.steps, "device": name,
            "torch": torch.__version__, "compile": args.compile, "peak_tflops": peak_tflops(device, args.peak_tflops),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python examples/gpt/train.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    slug = "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")[:24]
    stem = f"{meta['date_utc'][:10]}_{slug}_gpt_{args.config}_s{args.seqlen}"
    write(results, meta, Path(args.out_dir), stem)
    print(f"wrote {Path(args.out_dir) / stem}.json, .md, .png")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
