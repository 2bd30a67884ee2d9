#!/usr/bin/env bash
# s27 call 2: n31's IDLE_SKIP A/B (d64 non-causal 512-2k; ragged 900 d64/d128 both causal).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
timeout 200 python3 scripts/ab_gluon.py --out $OUT/d64nc --hdims 64 --causal no --seqlens 512 1024 2048 \
  --rounds 3 --try idle:IDLE_SKIP=1 2>&1 | grep -v Warn | tee -a $L
timeout 250 python3 scripts/ab_gluon.py --out $OUT/ragged --hdims 64 128 --causal both --seqlens 900 \
  --rounds 3 --try idle:IDLE_SKIP=1 2>&1 | grep -v Warn | tee -a $L
