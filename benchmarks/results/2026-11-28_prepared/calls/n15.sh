#!/usr/bin/env bash
# Issue 27 with the int64 decoded schedule (after n14.sh, same tree and .calls/base): the MLA 192/128 causal backward
# runs on the scheduled grid up to 8k rows. sm_90 (triton 3.6), scheduled MLA backward: 6,336 -> 5,832 instructions,
# spills 80 -> 104 B, but spill instructions inside the innermost HGMMA loops 7 -> 5 (the rest are per item).
# Prediction: MLA backward +0-2% at 2k-8k. Each tree in turn, twice (ab_mla_bwd times one tree against cuDNN).
set -uo pipefail
export PYTHONUNBUFFERED=1
L=$OUT/log.txt
for t in base new base new; do
  tree=src; [ $t = base ] && tree=.calls/base/src
  echo "== MLA bwd $t" | tee -a $L
  PYTHONPATH=$tree timeout 60 python3 scripts/ab_mla_bwd.py --out /tmp/mla_$t --rounds 2 --no-flex --seqlens 2048 8192 \
    2>&1 | grep -v Warn | tail -n 2 | tee -a $L
done
