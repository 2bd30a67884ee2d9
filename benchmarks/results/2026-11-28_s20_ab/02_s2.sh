#!/usr/bin/env bash
# Issue 27: the sink's cost with 9 interleaved rounds a row, two runs (H100).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r
for t in S1 S2; do
  timeout 280 python3 benchmarks/bench_sinks_mla.py --only sink --sink-rounds 9 --out-dir $OUT/r --tag $t 2>&1 | grep -i "sink" | tee -a $OUT/log.txt
done
