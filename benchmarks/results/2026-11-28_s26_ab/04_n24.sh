#!/usr/bin/env bash
# Session 26, call 04 (issue 29). On the tree that lands FIRST_FULL in CONFIGS_CAUSAL's d64 and PLACED_SCHEDULE in
# CONFIGS_MLA_SHORT_CAUSAL, with FP8's first-tile P kept inside each branch (call 03: FIRST_FULL FP8 came out wrong,
# 0.19-0.36 error non-causal, NaN causal).
# 1. GPU tests: FIRST_FULL on every stress shape, bf16 and now FP8; the tuning pins; the scheduled backward.
# 2. FP8 d128 (both) and d64 causal with FIRST_FULL against the default: correct now? faster?
# 3. d64 causal 512 / 1k / 2k: the Gluon default (now with FIRST_FULL) against Triton and cuDNN, two processes,
#    for AUTO_D64_CAUSAL_MIN_ROWS (2048; call 02 read Gluon 309-313 against Triton 298 at 1k, session 24 285 / 312).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 200 python3 -m pytest -q -n 14 -p no:cacheprovider tests/test_gluon.py -k "first_tile_unmasked \
  or scheduled_causal_grid or where_it_measured or tiles_for or grid_choice or auto" 2>&1 | tail -n 3 | tee -a $L
timeout 120 python3 scripts/ab_gluon.py --out $OUT/fp8 --dtypes fp8 --hdims 128 --causal both --seqlens 512 2048 \
  --rounds 3 --try ff:FIRST_FULL=1 2>&1 | grep -v Warn | tee -a $L
timeout 60 python3 scripts/ab_gluon.py --out $OUT/fp8d64 --dtypes fp8 --hdims 64 --causal yes --seqlens 2048 4096 \
  --rounds 3 --try ff:FIRST_FULL=1 2>&1 | grep -v Warn | tee -a $L
for r in a b; do
  timeout 80 python3 scripts/ab_gluon.py --out $OUT/d64c_$r --hdims 64 --causal yes --seqlens 512 1024 2048 \
    --rounds 3 --try noff:FIRST_FULL=0 2>&1 | grep -v Warn | tee -a $L
done
