#!/usr/bin/env bash
# Session 26, call 10 (issue 27): the MLA 192/128 causal backward at 16k against cuDNN (its default: one program per
# item), and the scheduled grid with the table of places there (CONFIGS_MLA_SHORT_CAUSAL's keys stop at 8k: the
# index table lost 1-4% at 16k in session 22). Four alternating rounds.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 200 python3 scripts/ab_mla_bwd.py --out $OUT --no-flex --rounds 4 --seqlens 16384 \
  --try sched:PERSISTENT_CAUSAL=1,L2_SECTIONS=1,PLACED_SCHEDULE=1 2>&1 | grep -v Warn | tee -a $L
