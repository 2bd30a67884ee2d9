#!/usr/bin/env bash
# s29 call 05 (issue 29): Gluon tunings at the two bf16 cells below cuDNN that Gluon runs: d64 non-causal 512 / 1k
# (three consumers, 4 stages of 128 keys, two Q stages, FREE_REGS; 0.96x cuDNN) and d256 causal 512 (0.97x).
# Variants: fewer stages, 64-key tiles with 6 stages, one Q stage (d64); no ping-pong, 32-key tiles (d256).
# Prediction: none within +2% at 512 (the last wave's 97% and the per-item chain, NOTES); measured to close the list.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 250 python3 scripts/ab_gluon.py --out $OUT/d64 --hdims 64 --causal no --seqlens 512 1024 --rounds 3 \
  --try s3:STAGES=3 s2:STAGES=2 n64:BLOCK_N=64,STAGES=6 q1:Q_STAGES=1 2>&1 | grep -v Warn | tee -a $L
timeout 200 python3 scripts/ab_gluon.py --out $OUT/d256 --hdims 256 --causal yes --seqlens 512 1024 --rounds 3 \
  --try pp0:PINGPONG=0 n32:BLOCK_N=32,STAGES=4 2>&1 | grep -v Warn | tee -a $L
