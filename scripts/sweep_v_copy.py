"""Time FP8's keys-last copy of V (kernels/portable/v_layout.v_keys_last) by tile of keys and warps, beside a plain
copy of the same bytes (torch's clone) as the bandwidth it could reach. Every FP8 forward call makes this copy
(21-25 µs for 32 MB on an H200, 2026-11-29: about a fifth of a 512-row causal call).

    PYTHONPATH=src python scripts/sweep_v_copy.py --out FILE.json

16k tokens a batch, hidden 2048 (the benchmarks' shape), head dims 64 / 128 / 256, seqlen 512 and 4096, key order
(the Triton FP8 forward's) and relabelled (the Gluon one's). Each candidate's output is checked against the default's.
"""

import argparse
import functools
import statistics

import torch
import triton
from result_rows import write_rows

from flashattn2.kernels.portable.v_layout import RELABEL_KEYS, v_keys_last

CANDIDATES = [(64, 4), (128, 2), (128, 4), (128, 8), (256, 4), (256, 8)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for head_dim in (64, 128, 256):
        for seqlen in (512, 4096):
            v = torch.randn(16384 // seqlen, seqlen, 2048 // head_dim, head_dim, device="cuda").to(torch.float8_e4m3fn)
            for relabel in (False, True):
                multiple = RELABEL_KEYS if relabel else 16
                ref = v_keys_last(v, multiple, relabel).view(torch.uint8)
                fns = {"clone": v.clone}
                for block_k, warps in CANDIDATES:
                    got = v_keys_last(v, multiple, relabel, block_k=block_k, num_warps=warps).view(torch.uint8)
                    assert torch.equal(got, ref), (block_k, warps)
                    fns[f"{block_k}x{warps}"] = functools.partial(v_keys_last, v, multiple, relabel, block_k=block_k,
                                                                  num_warps=warps)
                times = {n: [] for n in fns}
                for r in range(args.rounds):
                    for name, fn in (reversed if r % 2 else iter)(list(fns.items())):
                        times[name].append(triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3)
                med = {n: statistics.median(t) for n, t in times.items()}
                print(f"d{head_dim} s{seqlen} relabel={int(relabel)}: "
                      + "  ".join(f"{n} {t:.1f} us" for n, t in med.items()), flush=True)
                rows.append(dict(head_dim=head_dim, seqlen=seqlen, relabel=relabel, us=times, median_us=med,
                                 bytes=2 * v.numel()))
    if args.out:
        write_rows(args.out, rows)


if __name__ == "__main__":
    main()
