#!/usr/bin/env bash
# Session 24 call 3: Q_EARLY's test with two K/V stages beside its two Q stages; REVERSE_N / Q_EARLY A/B (bf16 and
# FP8, Gluon, one process); the backward tree A/B (bwd_mask_rel).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 70 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_gluon.py -k "q_early" 2>&1 | tail -n 2 | tee -a $L
timeout 230 python3 scripts/ab_gluon.py --out $OUT/bf16 --hdims 64 128 --causal both --seqlens 512 1024 2048 \
  --rounds 3 --try rn:REVERSE_N=1 qe:Q_EARLY=1 rnqe:REVERSE_N=1,Q_EARLY=1 2>&1 | grep -v Warn | tail -n 12 | tee -a $L
timeout 80 python3 scripts/ab_gluon.py --out $OUT/fp8 --dtypes fp8 --hdims 128 --causal yes --seqlens 512 2048 8192 \
  --rounds 3 --try rn:REVERSE_N=1 2>&1 | grep -v Warn | tail -n 3 | tee -a $L
timeout 190 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/bwd -- \
  --hdims 64 128 --modes bwd --causal 1 --seqlens 1024 4096 16384 2>&1 | grep -v Warn | tee -a $L
rm -f $OUT/bwd/base*.json $OUT/bwd/new0.json $OUT/bwd/new1.json
