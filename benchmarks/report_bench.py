"""Markdown of `python -m flashattn2.bench` result files: the full report beside each file, or the README
summary tables (ours / cuDNN and ours / SDPA-flash ratios, TFLOP/s at head dim 128) of one or more files:

    python benchmarks/report_bench.py benchmarks/results/STEM.json [...]            # writes STEM.md
    python benchmarks/report_bench.py --summary bf16.json fp16.json                  # prints the tables

The PNG: benchmarks/plot_bench.py.
"""

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flashattn2.bench.core import OURS
from flashattn2.bench.report import (
    NA,
    fmt_mib,
    fmt_ratio,
    fmt_s,
    fmt_tflops,
    markdown_table,
    pipe_table,
    ratio,
)

# Summary tables: the seqlen span the README quotes ratios over (inclusive), and the short causal span
# reported on its own because that is where ours is furthest behind cuDNN.
RATIO_SEQLENS: tuple[int, int] = (1024, 16384)
SHORT_CAUSAL_SEQLENS: tuple[int, int] = (512, 2048)
TFLOPS_HDIM = 128
TFLOPS_SEQLENS: tuple[int, ...] = (8192, 16384)
# Summary peers in column order, with the names the README uses for them.
SUMMARY_PEERS: dict[str, str] = {"sdpa-cudnn": "cuDNN", "sdpa-flash": "SDPA-flash"}


def memory_table(memory: Mapping[str, Any] | None, heading_level: int = 3) -> str:
    if not memory or not memory.get("rows"):
        return ""
    names: dict[str, None] = {}
    for r in memory["rows"]:
        for n in r["mib"]:
            names.setdefault(n, None)
    header = ["seqlen", "q+k+v", *names]
    body = [
        [str(r["seqlen"]), f"{r['qkv_mib']:.1f}", *(fmt_mib(r["mib"].get(n)) for n in names)]
        for r in memory["rows"]
    ]
    title = (
        f"{'#' * heading_level} Peak extra memory of forward+backward (MiB): {memory['dtype']}, "
        f"batch {memory['batch']}, {memory['nheads']} heads, hdim {memory['headdim']}, non-causal\n\n"
        "Peak allocated during the call minus allocated before it (inputs and dout already there).\n\n"
    )
    return title + pipe_table(header, body, 0) + "\n"


def notes_section(rows: Sequence[Mapping[str, Any]], memory: Mapping[str, Any] | None = None) -> str:
    """Why cells are n/a, one line per distinct (implementation, reason)."""
    seen: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        for name, reason in r.get("notes", {}).items():
            where = f"{r['dtype']} {r['mode']} d{r['hdim']}{' causal' if r['causal'] else ''} s{r['seqlen']}"
            seen.setdefault((name, reason), []).append(where)
    for r in (memory or {}).get("rows", []):
        for name, reason in r.get("notes", {}).items():
            seen.setdefault((name, reason), []).append(f"memory s{r['seqlen']}")
    if not seen:
        return ""
    lines = ["## n/a cells", ""]
    for (name, reason), where in seen.items():
        extra = f" (+{len(where) - 1} more)" if len(where) > 1 else ""
        lines.append(f"- {name}: {reason} — e.g. {where[0]}{extra}")
    return "\n".join(lines) + "\n"


def seqlen_label(seqlen: int) -> str:
    """1024 -> '1k', 512 -> '512' (how the README and the plots name seqlens)."""
    return f"{seqlen // 1024}k" if seqlen >= 1024 and seqlen % 1024 == 0 else str(seqlen)


def _span_label(span: tuple[int, int]) -> str:
    return f"{seqlen_label(span[0])}-{seqlen_label(span[1])}"


def _stored_ratio(row: Mapping[str, Any], peer: str) -> float | None:
    """ours / peer as the run stored it in 'ratios'; recomputed from TFLOP/s for rows without that key."""
    ratios = row.get("ratios")
    val = ratios.get(peer) if ratios is not None else ratio(row, peer)
    return val if val is not None and math.isfinite(val) else None


def _ratios_in(rows: Iterable[Mapping[str, Any]], mode: str, peer: str, span: tuple[int, int]) -> list[float]:
    """The ratios of one mode with seqlen in span (inclusive); rows without a value for peer are skipped."""
    vals = (_stored_ratio(r, peer) for r in rows if r["mode"] == mode and span[0] <= r["seqlen"] <= span[1])
    return [v for v in vals if v is not None]


def fmt_ratio_range(values: Sequence[float]) -> str:
    """'0.85-0.97'; a single number when both ends print the same; 'n/a' when there is nothing."""
    if not values:
        return NA
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _summary_keys(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, bool]]:
    """(dtype, hdim, causal) of the fwd and bwd rows: dtypes in first-seen order, then hdim, non-causal first."""
    rows = [r for r in rows if r["mode"] in ("fwd", "bwd")]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    keys = {(r["dtype"], r["hdim"], bool(r["causal"])) for r in rows}
    return sorted(keys, key=lambda k: (dtypes.index(k[0]), k[1], k[2]))


def ratio_table(
    rows: Sequence[Mapping[str, Any]],
    span: tuple[int, int] = RATIO_SEQLENS,
    short_span: tuple[int, int] = SHORT_CAUSAL_SEQLENS,
) -> str:
    """README ratio table: one line per (dtype, hdim, causal); ours / peer min-max over seqlens in span for
    forward and backward against cuDNN and SDPA-flash; last column the lowest ours / cuDNN of forward and
    backward with seqlen in short_span, causal lines only (blank otherwise). fwd_bwd rows are not used."""
    rows = list(rows)
    keys = _summary_keys(rows)
    if not keys:
        return "(no fwd or bwd results)\n"
    header = [
        "dtype",
        "hdim",
        "causal",
        *(f"{mode} / {label} {_span_label(span)}" for mode in ("fwd", "bwd") for label in SUMMARY_PEERS.values()),
        f"causal {_span_label(short_span)} / cuDNN, min",
    ]
    body = []
    for dtype, hdim, causal in keys:
        group = [r for r in rows if r["dtype"] == dtype and r["hdim"] == hdim and bool(r["causal"]) == causal]
        cells = [fmt_ratio_range(_ratios_in(group, m, p, span)) for m in ("fwd", "bwd") for p in SUMMARY_PEERS]
        short = ""
        if causal:
            worst = [v for m in ("fwd", "bwd") for v in _ratios_in(group, m, "sdpa-cudnn", short_span)]
            short = fmt_ratio(min(worst)) if worst else NA
        body.append([dtype, str(hdim), "yes" if causal else "no", *cells, short])
    return pipe_table(header, body, 3) + "\n"


def tflops_table(
    rows: Sequence[Mapping[str, Any]], hdim: int = TFLOPS_HDIM, seqlens: Sequence[int] = TFLOPS_SEQLENS
) -> str:
    """TFLOP/s of ours, cuDNN and SDPA-flash at one hdim and a few long seqlens, fwd and bwd, per dtype and
    causal. '' when no row matches. Where several files hold the same shape, the first row wins."""
    picked: dict[tuple[str, str, bool, int], Mapping[str, Any]] = {}
    for r in rows:
        if r["hdim"] == hdim and r["mode"] in ("fwd", "bwd") and r["seqlen"] in seqlens:
            picked.setdefault((r["dtype"], r["mode"], bool(r["causal"]), r["seqlen"]), r)
    if not picked:
        return ""
    dtypes = list(dict.fromkeys(k[0] for k in picked))
    order = [(d, m, c, s) for d in dtypes for m in ("fwd", "bwd") for c in (False, True) for s in sorted(seqlens)]
    names = [OURS, *SUMMARY_PEERS]
    header = ["dtype", "mode", "causal", "seqlen", "ours", *SUMMARY_PEERS.values()]
    body = [
        [d, m, "yes" if c else "no", str(s), *(fmt_tflops(picked[d, m, c, s].get("tflops", {}).get(n)) for n in names)]
        for d, m, c, s in order
        if (d, m, c, s) in picked
    ]
    return pipe_table(header, body, 3) + "\n"


def meta_line(meta: Mapping[str, Any]) -> str:
    """'NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, triton 3.6.0, 2026-11-21, commit 8c35195'."""
    date = str(meta.get("date_utc") or "unknown date").split(" ")[0]
    commit = meta.get("git_commit") or "unknown"
    if re.fullmatch(r"[0-9a-f]{40}", commit):
        commit = commit[:7]  # the short form the README quotes; anything else (an override) as given
    return (
        f"{meta.get('device') or 'unknown device'}, torch {meta.get('torch')}, triton {meta.get('triton')}, "
        f"{date}, commit {commit}"
    )


def summary_markdown(results: Sequence[Mapping[str, Any]]) -> str:
    """The two README tables and the meta line(s) under them, for result documents as write_json writes
    them ({"meta", "rows", ...}). Rows of all documents are pooled: give one file per dtype, not two runs
    of the same shapes (their ranges would merge)."""
    rows = [r for doc in results for r in doc.get("rows", [])]
    ratio_caption = (
        f"ours / peer TFLOP/s (> 1: ours is faster), min-max over seqlen {_span_label(RATIO_SEQLENS)}; "
        f"last column: lowest ours / cuDNN of forward and backward at seqlen {_span_label(SHORT_CAUSAL_SEQLENS)}, "
        "causal only."
    )
    parts = [ratio_caption, ratio_table(rows)]
    tf = tflops_table(rows)
    if tf:
        parts += [f"TFLOP/s at head dim {TFLOPS_HDIM}:", tf]
    # One line per distinct set-up; the dtypes say which line goes with which rows when files differ.
    lines: dict[str, list[str]] = {}
    for doc in results:
        dtypes = lines.setdefault(meta_line(doc.get("meta") or {}), [])
        dtypes += [d for d in dict.fromkeys(r["dtype"] for r in doc.get("rows", [])) if d not in dtypes]
    if len(lines) == 1:
        parts.append(f"Measured on {next(iter(lines))}.")
    else:
        parts.append("\n".join(f"- {', '.join(dtypes) or 'no rows'}: {line}" for line, dtypes in lines.items()))
    return "\n".join(p.rstrip("\n") + "\n" for p in parts)


def first_call_table(
    first_call: Sequence[Mapping[str, Any]] | None, cold_cache: bool | None = None, heading_level: int = 3
) -> str:
    """Wall seconds of the first forward and backward call of each (dtype, hdim, causal), compile included."""
    if not first_call:
        return ""
    if cold_cache is None:
        cache = "Triton cache state not recorded"
    elif cold_cache:
        cache = "Fresh Triton cache (--cold-cache): every kernel is compiled"
    else:
        cache = "Triton's disk cache as found: kernels an earlier run compiled are only loaded, not compiled"
    header = ["dtype", "hdim", "causal", "seqlen", "first fwd (s)", "first bwd (s)"]
    body = [
        [e["dtype"], str(e["hdim"]), "yes" if e["causal"] else "no", str(e["seqlen"])]
        + [fmt_s(e["fwd_s"]), fmt_s(e["bwd_s"])]
        for e in first_call
    ]
    title = (
        f"{'#' * heading_level} First call (s)\n\n"
        f"Wall time of the first {OURS} forward and backward of each combination, before any warm-up, "
        f"synchronised: what a user waits for on a new shape. {cache}. The first line also carries the "
        "process's one-time set-up (lazy imports torch and Triton do on the first kernel call).\n\n"
    )
    # Why a cell is n/a (the call failed), one line per failed combination.
    failed = [
        f"- {e['dtype']} d{e['hdim']}{' causal' if e['causal'] else ''}: {e['note']}"
        for e in first_call
        if e.get("note")
    ]
    return title + pipe_table(header, body, 3) + "\n" + ("\n" + "\n".join(failed) + "\n" if failed else "")


def markdown_report(
    meta: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    memory: Mapping[str, Any] | None = None,
    first_call: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    lines = ["# flashattn2 benchmark", ""]
    if _summary_keys(rows):
        lines += ["## Summary", "", summary_markdown([{"meta": meta, "rows": rows}]), "## Run", ""]
    lines += [f"- {key}: {'`' + str(val) + '`' if key == 'command' else val}" for key, val in meta.items()]
    lines += [
        "",
        f"TFLOP/s count attention matmul FLOPs (4·b·h·s²·d forward, halved when causal; backward 2.5x, "
        f"fwd_bwd 3.5x). ours/peer = {OURS} TFLOP/s / peer TFLOP/s: > 1 means ours is faster.",
        "",
        markdown_table(rows, heading_level=2),
    ]
    mem = memory_table(memory, heading_level=2)
    if mem:
        lines.append(mem)
    first = first_call_table(first_call, meta.get("cold_cache"), heading_level=2)
    if first:
        lines.append(first)
    notes = notes_section(rows, memory)
    if notes:
        lines.append(notes)
    return "\n".join(lines)


def write_markdown(
    path: str | Path,
    meta: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    memory: Mapping[str, Any] | None = None,
    first_call: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown_report(meta, rows, memory, first_call))
    return path


# ----------------------------------------------------------------------------------------------- CLI


def markdown_of(doc: Mapping[str, Any]) -> str:
    """The full report of one result document as write_json writes it."""
    return markdown_report(doc["meta"], doc["rows"], doc.get("memory"), doc.get("first_call"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/report_bench.py",
        description="Write FILE.md beside each result JSON of python -m flashattn2.bench, or with --summary print "
        "the README summary tables (ours / cuDNN and ours / SDPA-flash ratios, TFLOP/s at head dim 128) of them.",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE.json")
    parser.add_argument("--summary", action="store_true", help="print the README summary tables instead")
    args = parser.parse_args(argv)
    results = []
    for path in args.files:
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 2
    if args.summary:
        print(summary_markdown(results), end="")
        return 0
    for path, doc in zip(args.files, results, strict=True):
        out = path.with_suffix(".md")
        out.write_text(markdown_of(doc))
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
