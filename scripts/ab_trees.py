"""A/B of two source trees (a change no tuning key can switch: a shared helper, a mask's arithmetic), by the package
bench run in turn from each tree, base then new, for --rounds rounds (each run its own process, warm from the
second round on since Triton caches by source). Each run times its peer (cuDNN) beside ours, so a cell's speed is
read as ours over the peer of the same process, which takes out most drift between processes:

    python scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out OUT -- \\
        --hdims 64 128 --modes fwd --causal 1 --seqlens 512 1024 2048 4096

Prints, per cell, new / base (each ours over the peer, medians over rounds); the runs' JSON stay under OUT."""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def _run(tree: str, out: Path, tag: str, bench_args: list[str]) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, "-m", "flashattn2.bench", "--dtypes", "bf16", "--peers", "sdpa-cudnn", "--no-memory",
           "--out-dir", str(out), "--tag", tag, *bench_args]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / f"{tag}.json").read_text())["rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the base tree's src folder")
    parser.add_argument("--new", required=True, help="the new tree's src folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: the package bench's arguments")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench_args = [a for a in args.bench_args if a != "--"]
    ratios: dict[tuple, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        for name, tree in (("base", args.base), ("new", args.new)):
            for row in _run(tree, out, f"{name}{r}", bench_args):
                cell = (row["mode"], row["hdim"], row["causal"], row["seqlen"])
                ratios.setdefault(cell, {"base": [], "new": []})[name].append(row["ratios"]["sdpa-cudnn"])
    summary = []
    for cell, got in sorted(ratios.items()):
        base, new = statistics.median(got["base"]), statistics.median(got["new"])
        summary.append(dict(zip(("mode", "hdim", "causal", "seqlen"), cell, strict=True), base_vs_cudnn=round(base, 4),
                            new_vs_cudnn=round(new, 4), new_over_base=round(new / base, 4),
                            rounds=dict(base=got["base"], new=got["new"])))
        print(json.dumps(summary[-1]), flush=True)
    (out / "ab_trees.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
