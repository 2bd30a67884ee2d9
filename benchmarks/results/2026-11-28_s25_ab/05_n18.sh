#!/usr/bin/env bash
# Issue 29 / 27: the landed int64 schedule (50dd36d) on the other scheduled forwards: d256 causal (tree A/B, three
# rounds) and MLA 192/128 causal (ab_mla_fwd.py per tree; sm_90 SASS 6,080 -> 5,576 instructions, 12 B spills -> 0).
# Prediction: d256 causal +1-3% at 512, level at 2k; MLA +1-2% at 2k-8k, level at 16k (not scheduled).
set -uo pipefail
export PYTHONUNBUFFERED=1
L=$OUT/log.txt
for t in base new; do
  tree=src; [ $t = base ] && tree=.calls/base/src
  echo "== MLA fwd $t" | tee -a $L
  PYTHONPATH=$tree timeout 90 python3 scripts/ab_mla_fwd.py 2>&1 | grep -v Warn | tail -n 2 | tee -a $L
done
PYTHONPATH=src timeout 200 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/ab -- \
  --hdims 256 --modes fwd --causal 1 --seqlens 512 2048 2>&1 | grep -v Warn | tee -a $L
rm -f $OUT/ab/base*.json $OUT/ab/new0.json $OUT/ab/new1.json
