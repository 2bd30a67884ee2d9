#!/usr/bin/env bash
# Issue 29: ncu of the Gluon d64 causal forward at 512 (03) showed its SMs active 79% of the elapsed cycles (d128
# causal 93%) with half d128's work per item: the schedule's ITEM_COST (an item's prologue/epilogue, in key tiles,
# 1 now, chosen at d128/d256 on an H100) may weigh too little where tiles are cheap. ITEM_COST 0 / 3 / 6 and
# 64-key tiles, against the default, Triton and cuDNN in one process, three alternating rounds.
# Prediction: ITEM_COST 3 +2-5% at d64 512-1k, level at d128/d256 (within 1% of 1 there on the H100).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 380 python3 scripts/ab_gluon.py --out $OUT --hdims 64 128 256 --causal yes --seqlens 512 1024 2048 4096 \
  --rounds 3 --try ic0:ITEM_COST=0 ic3:ITEM_COST=3 ic6:ITEM_COST=6 bn64:BLOCK_N=64 2>&1 | grep -v Warn | tee -a $L
