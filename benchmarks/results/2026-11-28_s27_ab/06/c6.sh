#!/usr/bin/env bash
# s27 call 6 (issue 29, d64 non-causal 512 at 0.95x cuDNN): two consumers (128-row items: no padding rows at 512,
# where three consumers' 192-row items compute 1/9 padding) against the default three, H200; three alternating
# rounds, best kept.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 300 python3 scripts/ab_gluon.py --out $OUT/d64nc --hdims 64 --causal no --seqlens 512 1024 \
  --rounds 3 --try two:CONSUMERS=2 twopp:CONSUMERS=2,PINGPONG=1 twonofr:CONSUMERS=2,FREE_REGS=0 2>&1 | grep -v Warn | tee -a $L
