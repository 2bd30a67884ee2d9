#!/usr/bin/env bash
# Session 26, call 08: the landed d64 causal default (FIRST_FULL from 1k rows) against HEAD bea40a6, package bench
# under auto (Gluon from 2k rows), each process its cuDNN beside; three rounds (8k read -0.4% in call 07).
set -uo pipefail
export PYTHONUNBUFFERED=1
timeout 330 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT -- \
  --hdims 64 --modes fwd --causal 1 --seqlens 8192 16384 2>&1 | grep -v Warn | tee $OUT/log.txt
