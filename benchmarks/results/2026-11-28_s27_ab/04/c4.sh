#!/usr/bin/env bash
# s27 call 4 (issue 29, FP8 against FA3's figures: d128 non-causal 4k-16k at 0.90-0.94, d256 non-causal 512-1k and
# 8k at 0.91-0.95, H200): Gluon tuning variants over CONFIGS_FP8 (+ CONFIGS_FP8_DENSE), three alternating rounds.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 270 python3 scripts/ab_gluon.py --out $OUT/d128 --dtypes fp8 --hdims 128 --causal no --seqlens 4096 16384 \
  --rounds 3 --try n128s4:BLOCK_N=128,STAGES=4 freeregs:FREE_REGS=1 nopp:PINGPONG=0 q1:Q_STAGES=1 2>&1 | grep -v Warn | tee -a $L
timeout 270 python3 scripts/ab_gluon.py --out $OUT/d256 --dtypes fp8 --hdims 256 --causal no --seqlens 512 1024 8192 \
  --rounds 3 --try pp:PINGPONG=1 q2:Q_STAGES=2 n64s4:BLOCK_N=64,STAGES=4 freeregs:FREE_REGS=1 2>&1 | grep -v Warn | tee -a $L
