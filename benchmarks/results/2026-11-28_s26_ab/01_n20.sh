#!/usr/bin/env bash
# Issue 27 (prepared in session 25, compile-checked on sm_90 with triton 3.6): the MLA 192/128 causal backward on
# the scheduled grid (dense causal calls up to 8k rows) with the table of places (PLACED_SCHEDULE, a host key, off):
# sm_90 SASS 6,336 -> 5,832 instructions, spill stores 80 -> 104 B (in-loop spill instructions 7 -> 5, session 24).
# At d64 / d128 the same table measured 1% slower (results/2026-11-28_s25_ab/01), so it is off there.
# Prediction: MLA backward +0-2% at 2k-8k. One process, variants alternating, cuDNN beside (ab_mla_bwd.py).
# Copy to .calls/ and run from the repository root: bash .calls/n20.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_gluon.py tests/test_mla.py -k "scheduled_causal_grid \
  or backward_schedule" 2>&1 | tail -n 2 | tee -a $L
timeout 300 python3 scripts/ab_mla_bwd.py --out $OUT --no-flex --rounds 6 --seqlens 2048 4096 8192 \
  --try placed:PLACED_SCHEDULE=1 2>&1 | grep -v Warn | tee -a $L
