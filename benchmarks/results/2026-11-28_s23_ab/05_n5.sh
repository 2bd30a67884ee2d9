#!/usr/bin/env bash
# Issue 27 (session 23, call 5): the MLA 192/128 causal forward before and after score_mask's one limit a query,
# each tree's run its own process (base, new, base, new), cuDNN and FlexAttention in each.
set -uo pipefail
export PYTHONUNBUFFERED=1
for r in 1 2; do
  for t in base new; do
    tree=src; [ $t = base ] && tree=.calls/base/src
    echo "== $t $r" | tee -a $OUT/log.txt
    PYTHONPATH=$tree timeout 110 python3 scripts/ab_mla_fwd.py 2>&1 | grep -v Warn | tail -n 4 | tee -a $OUT/log.txt
  done
done
