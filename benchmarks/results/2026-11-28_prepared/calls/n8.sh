#!/usr/bin/env bash
# Issue 27 (prepared in session 23): the MLA 192/128 causal backward from each tree (base: .calls/base/src; new:
# the three prepared diffs, of which bwd_mask_rel touches the backward: 6,264 -> 6,128 instructions, spills 68 ->
# 72 B), base new base new, cuDNN beside. Prediction: +0-2%.
set -uo pipefail
export PYTHONUNBUFFERED=1
L=$OUT/log.txt
for t in base new base new; do
  tree=src; [ $t = base ] && tree=.calls/base/src
  echo "== MLA bwd $t" | tee -a $L
  PYTHONPATH=$tree timeout 60 python3 scripts/ab_mla_bwd.py --out /tmp/mla_$t --rounds 2 --no-flex --seqlens 2048 8192 \
    2>&1 | grep -v Warn | tail -n 2 | tee -a $L
done
