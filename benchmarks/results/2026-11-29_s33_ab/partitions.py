"""Stall samples of an ncu source-page CSV (call 06) by warp partition (split at each USETMAXREG), and for one
partition by opcode: python partitions.py CSV [FIRST LAST]."""

import csv
import sys
from collections import Counter


def num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    rows = list(csv.reader(open(sys.argv[1], newline="")))
    hi = next(i for i, r in enumerate(rows) if any("Warp Stall Sampling (All" in c for c in r))
    head = rows[hi]
    body = [r for r in rows[hi + 1:] if len(r) == len(head)]
    col = head.index("Warp Stall Sampling (All Samples)")
    ex = head.index("Instructions Executed")
    total = sum(num(r[col]) for r in body)
    starts = [i for i, r in enumerate(body) if "USETMAXREG" in r[1]]
    bounds = [0, *starts, len(body)]
    stalls = [i for i, c in enumerate(head) if c.startswith("stall_") and "Not Issued" not in c]
    for a, b in zip(bounds, bounds[1:], strict=False):
        s = sum(num(body[i][col]) for i in range(a, b))
        e = sum(num(body[i][ex]) for i in range(a, b))
        top = sorted(((head[c][6:], sum(num(body[i][c]) for i in range(a, b))) for c in stalls), key=lambda kv: -kv[1])
        reasons = ", ".join(f"{k} {v / max(s, 1) * 100:.0f}%" for k, v in top[:6])
        print(f"lines {a}-{b}: samples {s / total * 100:5.1f}%  executed {e:,.0f}  {reasons}")
    if len(sys.argv) > 3:
        first, last = int(sys.argv[2]), int(sys.argv[3])
        wait = head.index("stall_wait")
        samples, executed, waits = Counter(), Counter(), Counter()
        for r in body[first:last]:
            words = r[1].strip().split()
            op = (words[1] if words and words[0].startswith("@") else (words[0] if words else "")).split(".")[0]
            samples[op] += num(r[col])
            executed[op] += num(r[ex])
            waits[op] += num(r[wait])
        part = sum(samples.values())
        for op, s in samples.most_common(16):
            share, waited = s / part * 100, waits[op] / part * 100
            print(f"{op:12s} {share:5.1f}%  wait {waited:5.1f}%  executed {executed[op]:>12,.0f}")


if __name__ == "__main__":
    main()
