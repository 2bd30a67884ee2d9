#!/usr/bin/env bash
# s28 call 01: n41 (one_loop A/B) then n40 (ncu d64 causal 512)
set -uo pipefail
mkdir -p $OUT/n41 $OUT/n40
# n41.sh and n40.sh: benchmarks/results/2026-11-28_s27_prepared/, copied to .calls/ for the call
OUT=$OUT/n41 bash .calls/n41.sh
OUT=$OUT/n40 bash .calls/n40.sh
