#!/usr/bin/env bash
# Next session (issue 29): the Gluon forward's non-causal short cells (H200, session 21 call 10, ours / cuDNN at
# 512 / 1k: d128 0.95 / 0.91, d256 0.95 / 0.93): tunings over CONFIGS + CONFIGS_NONCAUSAL at 512-2k. Each variant
# compiles for sm_90 under triton 3.6 with no spills or C75xx (checked on CPU in session 21; d128 STAGES=3 does not fit).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 250 python3 scripts/ab_gluon.py --out $OUT/d128 --hdims 128 --causal no --seqlens 512 1024 2048 --rounds 2 \
  --try n64:BLOCK_N=64,STAGES=4 q1:Q_STAGES=1 o_in:SEPARATE_O=0 nopp:PINGPONG=0 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
timeout 250 python3 scripts/ab_gluon.py --out $OUT/d256 --hdims 256 --causal no --seqlens 512 1024 2048 --rounds 2 \
  --try n32:BLOCK_N=32,STAGES=3 nopp:PINGPONG=0 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
