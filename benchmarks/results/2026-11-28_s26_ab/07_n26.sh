#!/usr/bin/env bash
# Session 26, call 07: the landed d64 causal default (FIRST_FULL from 1k rows) against HEAD bea40a6, package bench
# under auto (Gluon from 2k rows), each process its cuDNN beside; two rounds.
set -uo pipefail
export PYTHONUNBUFFERED=1
timeout 330 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 2 --out $OUT -- \
  --hdims 64 --modes fwd --causal 1 --seqlens 2048 4096 8192 2>&1 | grep -v Warn | tee $OUT/log.txt
