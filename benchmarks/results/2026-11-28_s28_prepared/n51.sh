#!/usr/bin/env bash
# Issue 29, FP8 (any sm_90 card, about 60 s): the per-call keys-last copy of V (21-25 us for 32 MB on an H200, about a
# fifth of a 512-row FP8 causal call) by tile of keys and warps, beside torch's clone of the same bytes.
# scripts/sweep_v_copy.py checks every candidate's bytes against the default's. Prediction: the default (128 keys,
# 4 warps) at 0.6 of the clone's bandwidth; a larger tile or more warps within 0.8 of it (about -5 us a call). Land
# the winner as v_keys_last's default if it wins at every head dim, both orders.
# Copy to .calls/ and run from the repository root: bash .calls/n51.sh
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 200 python3 scripts/sweep_v_copy.py --out $OUT/v_copy.json 2>&1 | grep -v Warn | tee -a $L
