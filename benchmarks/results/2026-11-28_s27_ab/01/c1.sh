#!/usr/bin/env bash
# s27 call 1: n30 (latent multicast probe) then n31's GPU tests.
set -uo pipefail
mkdir -p $OUT/n30 $OUT/n31
OUT=$OUT/n30 bash .calls/n30.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/n31/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 300 python3 -m pytest -q -n 14 -p no:cacheprovider tests/test_gluon.py -k "idle_consumers or first_tile_unmasked \
  or scheduled_causal_grid" -rs 2>&1 | tail -n 15 | tee -a $L
