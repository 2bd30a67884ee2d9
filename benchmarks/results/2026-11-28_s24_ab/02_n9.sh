#!/usr/bin/env bash
# Session 24 call 2: n6's A/B timed out (18 cells in 150 s); Q_EARLY's test failed (8 of 417). Here: Q_EARLY's error,
# the KV-cache GPU tests (shared mask/finalize), the forward tree A/B on 8 cells.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_gluon.py --tb=short \
  -k "q_early and 3x65x257 and persistent" 2>&1 | grep -v Warn | tail -n 25 | tee -a $L
timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_kvcache.py 2>&1 | tail -n 2 | tee -a $L
timeout 300 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/fwd -- \
  --hdims 64 128 --modes fwd --causal both --seqlens 512 2048 2>&1 | grep -v Warn | tee -a $L
rm -f $OUT/fwd/base*.json $OUT/fwd/new0.json $OUT/fwd/new1.json
