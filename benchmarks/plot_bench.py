"""Plots of benchmark result files, drawn outside the package so that it needs no matplotlib:

    python benchmarks/plot_bench.py benchmarks/results/STEM.json [...]

writes STEM.png beside each file: for a `python -m flashattn2.bench` result, TFLOP/s against seqlen
per (head dim, causal) and mode with the memory panel; for a `python benchmarks/bench_features.py`
result (`*_features.json`), forward and backward ms per feature row.
"""

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on benchmark machines
import matplotlib.pyplot as plt  # noqa: E402

from flashattn2.bench.core import MODES, OURS  # noqa: E402
from flashattn2.bench.report import impl_names  # noqa: E402
from report_bench import seqlen_label  # noqa: E402  (beside this script: the one copy of the label)

MAX_PNG_BYTES = 1_000_000


def write_plot(
    path: str | Path,
    rows: Sequence[Mapping[str, Any]],
    memory: Mapping[str, Any] | None = None,
    dtype: str = "bf16",
    title: str | None = None,
    dpi: int = 90,
) -> Path | None:
    """TFLOP/s against seqlen, one panel per (hdim, causal) x mode for `dtype` (the first dtype present
    if it is absent), a line per implementation, and the memory panel along the bottom.

    Returns None when there is nothing to draw.
    """
    rows = list(rows)
    if rows and not any(r["dtype"] == dtype for r in rows):
        dtype = rows[0]["dtype"]
    sel = [r for r in rows if r["dtype"] == dtype]
    panels = sorted({(r["hdim"], bool(r["causal"])) for r in sel})
    modes = [m for m in MODES if any(r["mode"] == m for r in sel)]
    impls = impl_names(sel)
    has_mem = bool(memory and memory.get("rows"))
    nrows, ncols = len(panels) + (1 if has_mem else 0), max(1, len(modes))
    if nrows == 0:
        return None

    fig = plt.figure(figsize=(4.2 * ncols, 3.0 * nrows))
    grid = fig.add_gridspec(nrows, ncols)
    colors = {n: f"C{i}" for i, n in enumerate(impls)}
    handles: dict[str, Any] = {}
    for i, (hdim, causal) in enumerate(panels):
        for j, mode in enumerate(modes):
            ax = fig.add_subplot(grid[i, j])
            pts = sorted(
                (r for r in sel if r["hdim"] == hdim and bool(r["causal"]) == causal and r["mode"] == mode),
                key=lambda r: r["seqlen"],
            )
            xs = [r["seqlen"] for r in pts]
            for n in impls:
                ys = [r["tflops"].get(n) for r in pts]
                ys = [math.nan if y is None else y for y in ys]
                if all(math.isnan(y) for y in ys):
                    continue
                style = {"linewidth": 2.2} if n == OURS else {"linewidth": 1.2}
                (line,) = ax.plot(xs, ys, marker="o", markersize=3, color=colors[n], label=n, **style)
                handles.setdefault(n, line)
            _seqlen_axis(ax, xs)
            ax.set_title(f"{dtype} {mode} d={hdim}{' causal' if causal else ''}", fontsize=9)
            ax.set_ylim(bottom=0)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("TFLOP/s", fontsize=8)
            if i == len(panels) - 1 and not has_mem:
                ax.set_xlabel("seqlen", fontsize=8)
    if has_mem:
        assert memory is not None
        ax = fig.add_subplot(grid[nrows - 1, :])
        mrows = sorted(memory["rows"], key=lambda r: r["seqlen"])
        xs = [r["seqlen"] for r in mrows]
        names: dict[str, None] = {}
        for r in mrows:
            for n in r["mib"]:
                names.setdefault(n, None)
        for n in names:
            ys = [math.nan if r["mib"].get(n) is None else r["mib"][n] for r in mrows]
            if all(math.isnan(y) for y in ys):
                continue
            # Ours on top: the fused peers sit almost on the same line.
            style = {"linewidth": 2.2, "zorder": 3} if n == OURS else {"linewidth": 1.2}
            (line,) = ax.plot(xs, ys, marker="o", markersize=3, color=colors.get(n), label=n, **style)
            handles.setdefault(n, line)
        ax.plot(xs, [r["qkv_mib"] for r in mrows], linestyle="--", color="gray", label="q+k+v")
        _seqlen_axis(ax, xs)
        ax.set_yscale("log")
        ax.set_xlabel("seqlen", fontsize=8)
        ax.set_ylabel("MiB", fontsize=8)
        ax.set_title(
            f"peak extra memory, fwd+bwd ({memory['dtype']}, b={memory['batch']}, h={memory['nheads']}, "
            f"d={memory['headdim']}); dashed: q+k+v",
            fontsize=9,
        )
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, which="both")
    # Title and a shared legend in a strip above the panels (in inches, so it scales with the grid).
    height = 3.0 * nrows
    top = 1.0
    if title:
        fig.suptitle(title, y=1 - 0.08 / height, va="top", fontsize=10)
        top -= 0.3 / height
    if handles:
        fig.legend(
            handles.values(),
            handles.keys(),
            loc="upper center",
            bbox_to_anchor=(0.5, top - 0.03 / height),
            ncol=len(handles),
            fontsize=9,
            frameon=False,
        )
        top -= 0.35 / height
    fig.tight_layout(rect=(0, 0, 1, top))

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Keep the image small enough to commit: lower the resolution until it fits.
    for try_dpi in (dpi, 70, 55):
        fig.savefig(path, dpi=try_dpi)
        if path.stat().st_size <= MAX_PNG_BYTES:
            break
    plt.close(fig)
    return path


def _seqlen_axis(ax: Any, seqlens: Sequence[int]) -> None:
    """Log2 x axis labelled with the measured seqlens (512, 1k, ..., 16k)."""
    ax.set_xscale("log", base=2)
    ax.minorticks_off()
    if seqlens:
        ax.set_xticks(list(seqlens), [seqlen_label(s) for s in seqlens])


def _finish(fig: Any, ax: Any, path: str | Path) -> Path:
    """Legend, layout and the PNG at path (80 dpi) of a bar chart."""
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_feature_plot(path: str | Path, rows: Sequence[Mapping[str, Any]], device: str) -> Path:
    """Forward and backward ms of each feature-benchmark row, as horizontal bars."""
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    # feature rows (bench_features.py) and group rows (bench_sinks_mla.py); a forward-only row has no backward bar
    labels = [f"{r.get('feature', r.get('group'))}: {r['variant']}" for r in rows][::-1]
    ys = range(len(rows))
    ax.barh([y + 0.2 for y in ys], [r["fwd_ms"] for r in rows][::-1], height=0.4, label="forward")
    ax.barh([y - 0.2 for y in ys], [r["bwd_ms"] or 0.0 for r in rows][::-1], height=0.4, label="backward")
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.set_xlabel("ms (lower is better)")
    ax.set_title(f"flashattn2 feature costs, {device}")
    return _finish(fig, ax, path)


def write_bandwidth_plot(path: str | Path, rows: Sequence[Mapping[str, Any]], device: str) -> Path:
    """Rows that read a cache (bench_sinks_mla.py's latent group): GB/s as a fraction of the same run's copy, and
    of the bound (the copy or the same run's matmul rate over the call's FLOP per byte) where the row has it."""
    rows = [r for r in rows if r.get("of_copy") is not None]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    ys = range(len(rows))
    bound = any(r.get("of_bound") is not None for r in rows)
    height = 0.35 if bound else 0.6
    ax.barh([y + (height / 2 if bound else 0) for y in ys], [r["of_copy"] for r in rows][::-1], height=height,
            label="of copy")
    if bound:
        ax.barh([y - height / 2 for y in ys], [r.get("of_bound") or 0 for r in rows][::-1], height=height,
                label="of bound (copy or matmul)")
    ax.set_yticks(list(ys), [r["variant"] for r in rows][::-1], fontsize=8)
    ax.axvline(0.8, color="gray", linestyle="--", label="target: 0.8 of copy")
    ax.set_xlabel("bytes read / time, fraction of the device-to-device copy (higher is better)")
    ax.set_title(f"flashattn2 latent-cache decoding, {device}")
    return _finish(fig, ax, path)


def plot_file(json_path: str | Path) -> Path | None:
    """The PNG of one result file, beside it."""
    json_path = Path(json_path)
    doc = json.loads(json_path.read_text())
    png = json_path.with_suffix(".png")
    rows, meta = doc.get("rows", []), doc.get("meta", {})
    if rows and any(r.get("of_copy") is not None for r in rows):
        return write_bandwidth_plot(png, rows, meta.get("device", ""))
    if rows and "fwd_ms" in rows[0]:
        return write_feature_plot(png, rows, meta.get("device", ""))
    return write_plot(png, rows, doc.get("memory"), title=f"{OURS} — {meta.get('device', '')}")


def main(argv: Sequence[str] | None = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    for path in paths:
        png = plot_file(path)
        print(f"wrote {png}" if png else f"nothing to plot in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
