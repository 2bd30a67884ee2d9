#!/usr/bin/env bash
# Session 24 call 5: auto's d64 causal rule (Gluon from 8192 query rows) on the landed tree: Gluon against Triton,
# one process, 1k-8k.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
git log --oneline -1 | tee -a $L
timeout 200 python3 scripts/ab_gluon.py --out $OUT/d64c --hdims 64 --causal yes --seqlens 1024 2048 4096 8192 \
  --rounds 3 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
