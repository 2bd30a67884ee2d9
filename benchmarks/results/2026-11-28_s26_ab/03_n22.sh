#!/usr/bin/env bash
# Issue 29 (prepared in session 25; after n21.sh): FIRST_FULL and WIDE at d128 / d256 (both causal settings) and
# d64 non-causal (WIDE there: two consumers instead of the default three), and FIRST_FULL on FP8 d128; ping-pong
# off alone beside WIDE (which cannot ping-pong) at d128 / d256. One process per set, three alternating rounds.
# sm_90 (triton 3.6): WIDE d128 causal 2,608 instructions, d128 non-causal 2,832, d256 causal 2,304 (no spills).
# Copy to .calls/ and run from the repository root: bash .calls/n22.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 330 python3 scripts/ab_gluon.py --out $OUT/d128_d256 --hdims 128 256 --causal both --seqlens 512 1024 4096 \
  --rounds 3 --try ff:FIRST_FULL=1 nopp:PINGPONG=0 wide:WIDE=1,PINGPONG=0 2>&1 | grep -v Warn | tee -a $L
timeout 120 python3 scripts/ab_gluon.py --out $OUT/d64nc --hdims 64 --causal no --seqlens 512 2048 --rounds 3 \
  --try ff:FIRST_FULL=1 wide:WIDE=1,CONSUMERS=2,FREE_REGS=0 2>&1 | grep -v Warn | tee -a $L
timeout 100 python3 scripts/ab_gluon.py --out $OUT/fp8 --dtypes fp8 --hdims 128 --causal both --seqlens 512 2048 \
  --rounds 3 --try ff:FIRST_FULL=1 2>&1 | grep -v Warn | tee -a $L
