#!/usr/bin/env bash
# Session 26, call 09 (issue 29): d64 causal at 512 / 1k, the cell furthest behind (Triton 234 against cuDNN 261 at
# 512). WIDE (one 8-warp consumer partition) read +13% over the Gluon default at 512 in call 02 (221, still under
# Triton): its neighbours, each compile-checked on sm_90 under triton 3.6 (no spills, no C75xx): 3 or 2 stages, one Q
# stage, no lazy O wait, O not apart with one Q stage, FREE_REGS, ITEM_COST 3 (a host key), FIRST_FULL.
# Prediction: one of them at or above Triton at 512 -> auto could take Gluon WIDE there.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
W=WIDE=1,FIRST_FULL=0
timeout 280 python3 scripts/ab_gluon.py --out $OUT/d64c --hdims 64 --causal yes --seqlens 512 1024 --rounds 3 \
  --try w:$W w_ff:WIDE=1,FIRST_FULL=1,FIRST_FULL_MIN_ROWS=0 w_s3:$W,STAGES=3 w_s2:$W,STAGES=2 w_q1:$W,Q_STAGES=1 \
  w_nolazy:$W,LAZY_O_WAIT=0 w_nosep_q1:$W,SEPARATE_O=0,Q_STAGES=1,LAZY_O_WAIT=0 w_free:$W,FREE_REGS=1 \
  w_cost3:$W,ITEM_COST=3 2>&1 | grep -v Warn | tee -a $L
