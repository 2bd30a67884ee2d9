#!/usr/bin/env bash
# Issue 29 (prepared in session 24, compile-checked on sm_90 with triton 3.6, not run on a GPU): the schedule table
# as int64, each item (block | batch << 21 | head << 42) worked out on the host (decoded_schedule_int64.diff), one
# LDG.64 an item in each partition instead of a load and four integer divisions. Session 24 ran the same idea as
# three int32 loads (tried/decoded_schedule_s24.diff): tests passed, forward d128 causal 512 -5.6%, 2k +3.6%,
# backward +0.7 / -0.7%; its SASS issued two of the three loads after the item's branch (two load latencies).
# Now: forward d128 causal 5,416 -> 4,952 instructions, d64 causal 4,912 -> 4,456, MLA 6,080 -> 5,576 (spills 12 ->
# 0 B); backward d128 causal 6,344 -> 5,784, d64 causal 7,976 -> 7,456 (spills 20 B as before).
# Prediction: forward d128 causal +2-4% at 512, +2-4% at 2k; backward +0-1%.
# Locally first:
#   rm -rf .calls/base && mkdir -p .calls/base && git archive HEAD src | tar -x -C .calls/base
#   git apply benchmarks/results/2026-11-28_prepared/decoded_schedule_int64.diff
#   cp benchmarks/results/2026-11-28_prepared/calls/n14.sh .calls/
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
grep -c "decoded_schedule" src/flashattn2/kernels/sm90/forward.py .calls/base/src/flashattn2/kernels/sm90/forward.py | tee -a $L
timeout 125 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_gluon.py tests/test_mla.py -k "persistent_causal_walk \
  or scheduled_causal_grid or plan_first_made or l2_sections or (forward_stress and causal) or (gluon_unlike and causal \
  and not compiles)" 2>&1 | tail -n 2 | tee -a $L
timeout 200 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/ab -- \
  --hdims 64 128 --modes fwd bwd --causal 1 --seqlens 512 2048 2>&1 | grep -v Warn | tee -a $L
rm -f $OUT/ab/base*.json $OUT/ab/new0.json $OUT/ab/new1.json
