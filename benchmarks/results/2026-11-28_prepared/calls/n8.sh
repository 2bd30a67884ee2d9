#!/usr/bin/env bash
# Issues 29 and 27 (prepared in session 23): the backward's tree A/B (d64 / d128 causal; bwd_mask_rel is the only
# prepared change under it), then the MLA 192/128 causal backward from each tree (base: .calls/base/src; new:
# the five prepared diffs, of which bwd_mask_rel touches the backward: 6,264 -> 6,128 instructions, spills 68 ->
# 72 B), base new base new, cuDNN beside. Prediction: +0-2%. Last, the MLA forward with REVERSE_N.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
timeout 150 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/bwd -- \
  --hdims 64 128 --modes bwd --causal 1 --seqlens 1024 4096 16384 2>&1 | grep -v Warn | tee -a $L
rm -f $OUT/bwd/base*.json $OUT/bwd/new0.json $OUT/bwd/new1.json
for t in base new base new; do
  tree=src; [ $t = base ] && tree=.calls/base/src
  echo "== MLA bwd $t" | tee -a $L
  PYTHONPATH=$tree timeout 60 python3 scripts/ab_mla_bwd.py --out /tmp/mla_$t --rounds 2 --no-flex --seqlens 2048 8192 \
    2>&1 | grep -v Warn | tail -n 2 | tee -a $L
done
# the MLA forward with REVERSE_N (Q_EARLY cannot apply: a second Q stage does not fit its shared memory)
timeout 90 python3 scripts/ab_mla_fwd.py rn:REVERSE_N=True 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
