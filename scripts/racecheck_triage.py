"""Group compute-sanitizer racecheck reports by (hazard, writing line, reading line) and sort them into the patterns
read before (issue 30), so that a log of thousands of reports becomes a short table:

    compute-sanitizer --tool racecheck --racecheck-report all --print-limit 0 --show-backtrace no \\
        python scripts/sanitize.py --family latent > racecheck-latent.log 2>&1
    python scripts/racecheck_triage.py racecheck-latent.log [--ordered latent.py:235,latent.py:270 ...]

Patterns:
- `ws-state`: written at the kernel's `def` line by lane 31 of a default-partition warp and read there by a worker
  warp: the state word of Triton's warp-specialisation dispatch, ordered by a named barrier racecheck does not pair;
- `ws-exit`: written at an `mbarrier.invalidate` line (or the `for` line of its unrolled loop, or the `if` line of
  a constexpr branch over it: the line racecheck names when the kernel's last invalidate is conditional) by a
  default-partition thread after the `warp_specialize` region, and read at the kernel's `def` line by a worker
  warp: Triton 3.6 keeps that dispatch state at the base of shared memory, live only while a region starts, so a
  barrier allocated there may alias it; the default warps invalidate it, store the exit state and meet the workers
  at the same named barrier (`bar.sync 1`, all threads) before the workers read the state, as in `ws-state`;
- `handoff`: one warpgroup stores a shared-memory buffer (`sm.NAME...store(`) and another loads it
  (`sm.NAME...load(`), and the same mbarrier orders the two accesses: arrived on within HANDOFF_LINES lines after the
  first access (RAW: the store; WAR: the load) and waited on within HANDOFF_LINES lines before the second. Triton
  lowers the arrive to `bar.sync` over the warpgroup, then one thread's `mbarrier.arrive`, and each reading thread
  waits itself: ordered under PTX's memory model (the arrive's release is cumulative over the barrier), a pairing
  racecheck does not make; ConSan (scripts/consan_gluon.py), which models mbarriers, checks these kernels;
- `ordered`: a (write line, read line) pair given with --ordered, i.e. one the kernel orders through an mbarrier
  (racecheck does not model mbarrier waits; ConSan, scripts/consan_gluon.py, does);
- `unexplained`: everything else, to read against the kernel's barrier protocol.
Exit status 1 when any report is unexplained."""

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

HAZARD = re.compile(r"Potential (\w+) hazard detected at __shared__ (0x[0-9a-f]+)")
ACCESS = re.compile(r"(Write|Read) Thread \((\d+),\d+,\d+\) at (\S+?)\+0x[0-9a-f]+ in (\S+:\d+)")
SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards displayed \((\d+) errors")
BUFFER = re.compile(r"\b(sm\.\w+)\b[^=]*?\.(store|load)\(")
BARRIER = re.compile(r"mbarrier\.(arrive|wait)\((sm\.\w+)")
HANDOFF_LINES = 5  # how far from an access its mbarrier arrive or wait may sit (a fence, a wgmma between)


def parse(lines):
    """(kind, kernel, write line, read line, write thread, read thread) per report."""
    reports, current = [], None
    for line in lines:
        m = HAZARD.search(line)
        if m:
            current = {"kind": m.group(1)}
            continue
        m = ACCESS.search(line)
        if m and current is not None:
            side = m.group(1).lower()
            current[side] = (int(m.group(2)), m.group(3), m.group(4))
            if "write" in current and "read" in current:
                reports.append(current)
                current = None
    return reports


def source_lines(where: str, src: Path, count: int = 1) -> list[list[str]]:
    """Lines N.. N + count - 1 of file.py:N in each file of that name under src (a log names the file, not its
    folder)."""
    name, line = where.rsplit(":", 1)
    texts = (path.read_text().splitlines() for path in src.rglob(name))
    return [text[int(line) - 1:int(line) - 1 + count] for text in texts if 0 < int(line) <= len(text)]


def is_def_line(where: str, src: Path) -> bool:
    """Whether file.py:N (found under src) is a `def` line: where Triton attributes its dispatch state."""
    return any(lines[0].lstrip().startswith("def ") for lines in source_lines(where, src))


def invalidates(where: str, src: Path) -> bool:
    """Whether file.py:N invalidates an mbarrier, itself or as the `for` line of an unrolled loop or the `if` line
    of a constexpr branch that does (the line racecheck names for the body)."""
    calls = "mbarrier.invalidate("
    return any(calls in lines[0] or (lines[0].lstrip().startswith(("for ", "if ")) and calls in "".join(lines[1:]))
               for lines in source_lines(where, src, 2))


def _barriers(where: str, src: Path, op: str, after: bool) -> set:
    """The mbarriers (sm.NAME) that the HANDOFF_LINES lines after (or before) file.py:N arrive on or wait on (op
    "arrive" or "wait")."""
    name, line = where.rsplit(":", 1)
    n = int(line)
    first = n + 1 if after else max(n - HANDOFF_LINES, 1)
    found = set()
    for lines in source_lines(f"{name}:{first}", src, HANDOFF_LINES if after else n - first):
        found |= {m.group(2) for text in lines for m in BARRIER.finditer(text) if m.group(1) == op}
    return found


def _access(where: str, src: Path):
    """(buffer, "store" | "load") of the shared-memory access at file.py:N, or None."""
    for lines in source_lines(where, src):
        m = BUFFER.search(lines[0])
        if m:
            return m.group(1), m.group(2)
    return None


def is_handoff(kind: str, w_line: str, r_line: str, src: Path) -> bool:
    """Whether a store and a load of one buffer are ordered by an mbarrier arrived after the first and waited on
    before the second (see `handoff`)."""
    w, r = _access(w_line, src), _access(r_line, src)
    if not w or not r or w != (r[0], "store") or r[1] != "load":
        return False
    first, second = (w_line, r_line) if kind == "RAW" else (r_line, w_line)
    return bool(_barriers(first, src, "arrive", True) & _barriers(second, src, "wait", False))


def classify(report, ordered: set, src: Path) -> str:
    (w_thread, _, w_line), (r_thread, _, r_line) = report["write"], report["read"]
    # lane 31 of a default-partition warp writes, a worker warp's lane reads, both at the kernel's def line
    if w_line == r_line and w_thread % 32 == 31 and r_thread >= 128 and is_def_line(w_line, src):
        return "ws-state"
    # a default-partition thread invalidates a barrier aliasing the state the worker then reads (see ws-exit)
    if (w_thread < 128 <= r_thread and is_def_line(r_line, src)
            and invalidates(w_line, src)):
        return "ws-exit"
    if w_thread // 128 != r_thread // 128 and is_handoff(report["kind"], w_line, r_line, src):
        return "handoff"
    if (w_line, r_line) in ordered:
        return "ordered"
    return "unexplained"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--ordered", action="append", default=[],
                    help="WRITE_LINE,READ_LINE (file.py:N,file.py:M) that an mbarrier orders; repeatable")
    ap.add_argument("--src", default=str(SRC), help="the source tree that ran (line numbers are its own)")
    args = ap.parse_args(argv)
    ordered = {tuple(pair.split(",")) for pair in args.ordered}
    unexplained = 0
    for path in args.logs:
        with open(path, errors="replace") as f:
            lines = f.readlines()
        reports = parse(lines)
        summary = [SUMMARY.search(line) for line in lines]
        summary = [m for m in summary if m]
        errors = sum(int(m.group(2)) for m in summary)
        groups = Counter((classify(r, ordered, Path(args.src)), r["kind"], r["write"][2], r["read"][2])
                         for r in reports)
        print(f"{path}: {len(reports)} reports parsed, {errors} errors in the summary line(s)")
        if errors > len(reports):
            print("  (not every report was printed: run with --print-limit 0)")
        for (pattern, kind, w_line, r_line), count in sorted(groups.items(), key=lambda x: (x[0][0], -x[1])):
            print(f"  {pattern:12s} {kind} write {w_line:24s} read {r_line:24s} {count}")
            if pattern == "unexplained":
                unexplained += count
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
