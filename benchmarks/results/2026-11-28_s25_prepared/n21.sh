#!/usr/bin/env bash
# Issue 29 (prepared in session 25, compile-checked on sm_90 with triton 3.6): FIRST_FULL, a forward tuning key
# (off): an item's first key tile skips the mask where every row sees it whole. ncu of d64 / d128 causal at 512
# (results/2026-11-28_s25_ab/03): each item's first tile ran the masked code (mask compares, selects and the -inf
# row guard) though only block 0's first tile is cut; non-causal items likewise. Both versions are compiled, one
# uniform branch picks. Prediction: +2-4% at 512 (causal and not), +1-2% at 1k, level from 4k.
# Tests (both grids, every head dim, packed batches), then ab_gluon in one process against the default, the
# Triton forward and cuDNN, three alternating rounds; FP8 d128 too.
# Copy to .calls/ and run from the repository root: bash .calls/n21.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_gluon.py -k "first_tile_unmasked" 2>&1 \
  | tail -n 2 | tee -a $L
timeout 300 python3 scripts/ab_gluon.py --out $OUT/bf16 --hdims 64 128 256 --causal both --seqlens 512 1024 2048 4096 \
  --rounds 3 --try ff:FIRST_FULL=1 2>&1 | grep -v Warn | tee -a $L
timeout 100 python3 scripts/ab_gluon.py --out $OUT/fp8 --dtypes fp8 --hdims 128 --causal both --seqlens 512 2048 \
  --rounds 3 --try ff:FIRST_FULL=1 2>&1 | grep -v Warn | tee -a $L
