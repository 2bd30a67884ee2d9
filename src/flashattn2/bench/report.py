"""What the benchmark commands record and print: run metadata, stdout lines, the result JSON, and the
per-(dtype, mode) TFLOP/s table (printed at the end of a run and by `python -m flashattn2`).

The result files' markdown reports and the README summary tables come from benchmarks/report_bench.py,
the plots from benchmarks/plot_bench.py: outside the package, as formatting.
"""

import datetime as _dt
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .core import MODES, OURS

NA = "n/a"
# The peers the project quotes ratios against; the others are in the TFLOP/s columns.
DEFAULT_RATIO_PEERS: tuple[str, ...] = ("sdpa-flash", "sdpa-cudnn")


# ---------------------------------------------------------------------------------------------- meta


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (safe in file names)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-device"


def default_stem(device_name: str, now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return f"{now:%Y-%m-%d}_{device_slug(device_name)}"


def git_commit(cwd: str | Path | None = None) -> str | None:
    """HEAD of the repository holding this package (not of the caller's cwd), or None.

    FLASHATTN2_GIT_COMMIT wins: a copy of the tree without .git (a lent GPU machine) can still say
    which commit it measured."""
    if os.environ.get("FLASHATTN2_GIT_COMMIT"):
        return os.environ["FLASHATTN2_GIT_COMMIT"]
    cwd = cwd or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def collect_meta(
    device_name: str,
    argv: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
    prog: str = "python -m flashattn2.bench",
) -> dict[str, Any]:
    """Device, versions, date, commit and the command line (prog and argv) of a run, plus extra."""
    import torch

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    now = _dt.datetime.now(_dt.timezone.utc)
    argv = list(sys.argv[1:] if argv is None else argv)
    meta: dict[str, Any] = {
        "device": device_name,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "date_utc": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "git_commit": git_commit(),
        "command": prog + (" " + shlex.join(argv) if argv else ""),
    }
    meta.update(extra or {})
    return meta


# ---------------------------------------------------------------------------------------- formatting


def fmt_tflops(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return NA
    # GPU numbers read best with one decimal; tiny CPU smoke numbers need significant digits.
    return f"{x:.1f}" if x >= 1 else f"{x:.3g}"


def fmt_ratio(x: float | None) -> str:
    return NA if x is None else f"{x:.2f}"


def impl_names(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Implementations in first-seen order, ours first."""
    names: dict[str, None] = {}
    for row in rows:
        for name in row.get("tflops", {}):
            names.setdefault(name, None)
    ordered = list(names)
    if OURS in names:
        ordered.remove(OURS)
        ordered.insert(0, OURS)
    return ordered


def ratio(row: Mapping[str, Any], peer: str) -> float | None:
    """ours / peer TFLOP/s, recomputed from the row so hand-made rows need no 'ratios' key."""
    tf = row.get("tflops", {})
    mine, theirs = tf.get(OURS), tf.get(peer)
    if mine is None or not theirs:
        return None
    return mine / theirs


def _ratio_peers(
    rows: Sequence[Mapping[str, Any]], impls: Sequence[str], ratio_peers: Sequence[str] | None
) -> list[str]:
    if ratio_peers is not None:
        return [p for p in ratio_peers if p != OURS]
    if OURS not in impls:
        return []

    def measured(peer: str) -> bool:
        return any(r.get("tflops", {}).get(peer) is not None for r in rows)

    default = [p for p in DEFAULT_RATIO_PEERS if p in impls]
    if any(measured(p) for p in default):
        return default
    # A CPU run has neither fused SDPA peer: compare against the peers it did measure instead.
    return [p for p in impls if p != OURS and measured(p)] or default


def pipe_table(header: Sequence[str], body: Iterable[Sequence[str]], right_from: int = 0) -> str:
    """A markdown pipe table; columns from right_from on are right-aligned."""
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---:" if i >= right_from else "---" for i in range(len(header))) + "|")
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def _group_order(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    modes += [m for m in dict.fromkeys(r["mode"] for r in rows) if m not in modes]
    return [(d, m) for d in dtypes for m in modes if any(r["dtype"] == d and r["mode"] == m for r in rows)]


def markdown_table(
    rows: Sequence[Mapping[str, Any]],
    impls: Sequence[str] | None = None,
    ratio_peers: Sequence[str] | None = None,
    heading_level: int = 3,
) -> str:
    """One markdown table per (dtype, mode): hdim, causal, seqlen, TFLOP/s per implementation, then
    ours/peer ratio columns (default sdpa-flash and sdpa-cudnn). Missing values render as 'n/a'."""
    rows = list(rows)
    if not rows:
        return "(no results)\n"
    impls = list(impls) if impls is not None else impl_names(rows)
    peers = _ratio_peers(rows, impls, ratio_peers)
    header = ["hdim", "causal", "seqlen", *impls, *(f"ours/{p}" for p in peers)]
    parts = []
    for dtype, mode in _group_order(rows):
        group = sorted(
            (r for r in rows if r["dtype"] == dtype and r["mode"] == mode),
            key=lambda r: (r["hdim"], bool(r["causal"]), r["seqlen"]),
        )
        body = [
            [
                str(r["hdim"]),
                "yes" if r["causal"] else "no",
                str(r["seqlen"]),
                *(fmt_tflops(r.get("tflops", {}).get(n)) for n in impls),
                *(fmt_ratio(ratio(r, p)) for p in peers),
            ]
            for r in group
        ]
        parts.append(f"{'#' * heading_level} {dtype} {mode} (TFLOP/s)\n\n" + pipe_table(header, body, 2))
    return "\n\n".join(parts) + "\n"


# ------------------------------------------------------------------------------------- stdout lines


def fmt_s(x: float | None) -> str:
    return NA if x is None else f"{x:.2f}"


def fmt_mib(x: float | None) -> str:
    return NA if x is None else f"{x:.1f}"


def first_call_line(entry: Mapping[str, Any]) -> str:
    return (
        f"first call {entry['dtype']} hdim {entry['hdim']} causal {int(bool(entry['causal']))} "
        f"seqlen {entry['seqlen']}: fwd {fmt_s(entry['fwd_s'])} s, bwd {fmt_s(entry['bwd_s'])} s"
        + (f" ({entry['note']})" if entry.get("note") else "")
    )


def stdout_header(impls: Sequence[str]) -> str:
    cols = "".join(f"{n:>13}" for n in impls)
    return f"{'dtype':<5} {'mode':<7} {'hdim':>4} {'causal':>6} {'seqlen':>6} {'batch':>5} {'heads':>5}{cols}"


def stdout_line(row: Mapping[str, Any], impls: Sequence[str]) -> str:
    """One compact line per measured row; 'skip' marks a deliberately skipped naive run."""
    cells = []
    for n in impls:
        val = row["tflops"].get(n)
        if val is None:
            cells.append("skip" if row.get("notes", {}).get(n, "").startswith("skipped") else NA)
        else:
            cells.append(fmt_tflops(val))
    cols = "".join(f"{c:>13}" for c in cells)
    return (
        f"{row['dtype']:<5} {row['mode']:<7} {row['hdim']:>4} {int(bool(row['causal'])):>6} "
        f"{row['seqlen']:>6} {row['batch']:>5} {row['nheads']:>5}{cols}"
    )


def memory_line(row: Mapping[str, Any]) -> str:
    cells = " ".join(f"{n}={fmt_mib(v)}" for n, v in row["mib"].items())
    return f"memory seqlen {row['seqlen']:>6}  q+k+v={row['qkv_mib']:.1f} MiB  {cells}"


# --------------------------------------------------------------------------------------------- files


def write_json(
    path: str | Path,
    meta: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    memory: Mapping[str, Any] | None = None,
    first_call: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "meta": dict(meta),
        "rows": list(rows),
        "memory": memory,
        "first_call": None if first_call is None else list(first_call),
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
