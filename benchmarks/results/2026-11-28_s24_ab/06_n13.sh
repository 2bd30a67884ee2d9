#!/usr/bin/env bash
# Session 24 call 6 (prepared and run in the same session): the schedule table holds each item worked out
# (block, batch, head; tile_order.decoded_schedule), no integer divisions an item on the scheduled grids. sm_90
# (triton 3.6): forward d128 causal 5,416 -> 4,960 instructions, d64 causal 4,912 -> 4,472, MLA 6,080 -> 5,600
# (spills 12 -> 0 B); backward d128 causal 6,344 -> 5,864, d64 causal 7,976 -> 7,504 (spills 20 -> 24 B).
# Prediction: forward d128 causal +2-4% at 512, +1% at 2k; backward d128 causal +1% at 512, level at 2k.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
grep -c "decoded_schedule" src/flashattn2/kernels/sm90/forward.py .calls/base/src/flashattn2/kernels/sm90/forward.py | tee -a $L
timeout 125 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_gluon.py tests/test_mla.py -k "persistent_causal_walk \
  or scheduled_causal_grid or plan_first_made or l2_sections or (forward_stress and causal) or (gluon_unlike and causal \
  and not compiles)" 2>&1 | tail -n 2 | tee -a $L
timeout 140 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/ab -- \
  --hdims 128 --modes fwd bwd --causal 1 --seqlens 512 2048 2>&1 | grep -v Warn | tee -a $L
rm -f $OUT/ab/base*.json $OUT/ab/new0.json $OUT/ab/new1.json
