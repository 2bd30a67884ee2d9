#!/usr/bin/env bash
# s27 call 8 (issue 29, d64 causal 1k: 0.88x cuDNN on the Triton forward in call 07; auto's rule runs Gluon from
# 2048 rows): Gluon (FIRST_FULL from 1024 rows) against Triton at 768-1536 rows, five alternating rounds, twice.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
for r in 1 2; do
timeout 150 python3 scripts/ab_gluon.py --out $OUT/r$r --hdims 64 --causal yes --seqlens 768 1024 1536 \
  --rounds 5 2>&1 | grep -v Warn | tee -a $L
done
