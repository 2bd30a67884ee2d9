#!/usr/bin/env bash
# Issue 29: the int64 decoded schedule in the forward only (n14: forward d128 causal 512 +6.0%, 2k +0.5%; backward
# -1.0 / -1.4% at d64 causal, so the backward keeps its int32 table: WorkGrid.decoded follows the table's type;
# sm_90 backward SASS 6,344 instructions as the base). Tests of the scheduled grids, then forward A/B again.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_gluon.py tests/test_mla.py -k "persistent_causal_walk \
  or scheduled_causal_grid or plan_first_made or l2_sections or (forward_stress and causal) or (gluon_unlike and causal \
  and not compiles) or (backward and causal)" 2>&1 | tail -n 2 | tee -a $L
timeout 200 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/ab -- \
  --hdims 64 128 --modes fwd --causal 1 --seqlens 512 2048 8192 2>&1 | grep -v Warn | tee -a $L
rm -f $OUT/ab/base*.json $OUT/ab/new0.json $OUT/ab/new1.json
