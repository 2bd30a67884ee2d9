"""Top SASS lines by warp-stall samples from `ncu -i R --page source --csv --print-source sass` (argv[1]) -> stdout."""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], newline="")))
head_i = next(i for i, r in enumerate(rows) if any("Warp Stall Sampling (All" in c for c in r))
head = rows[head_i]
col = next(i for i, c in enumerate(head) if c.startswith("Warp Stall Sampling (All"))
body = [r for r in rows[head_i + 1:] if len(r) == len(head)]


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


total = sum(num(r[col]) for r in body)
print("columns:", head)
print(f"lines {len(body)}, samples {total:.0f}")
idx = sorted(range(len(body)), key=lambda i: -num(body[i][col]))[:int(sys.argv[2]) if len(sys.argv) > 2 else 60]
for i in idx:
    r = body[i]
    print(f"{i:6d} {num(r[col]) / total * 100:5.1f}% | " + " | ".join(c for c in r if c)[:400])
