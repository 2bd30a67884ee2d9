#!/usr/bin/env bash
# Issue 29 (prepared in session 25, compile-checked on sm_90 with triton 3.6; not run on a GPU). Two forward tuning
# keys, off, landed as keys:
# - FIRST_FULL: an item's first key tile skips the mask where every row sees it whole (ncu, s25 call 03: every
#   item's first tile ran the masked code). sm_90 d128 causal 4,952 -> 5,928 instructions (two versions, one
#   uniform branch). Prediction: +2-4% at 512, +1-2% at 1k, level from 4k.
# - WIDE: the two consumer warpgroups as one 8-warp partition (one code copy; 128-row wgmmas; a named barrier of
#   the two before each release). ncu at 512: "no instruction" stalls 24% of d64 causal's samples (7% at d128).
#   sm_90 d64 causal 4,456 -> 2,416 instructions, d128 causal 4,952 -> 2,608 (no ping-pong then). Prediction: d64
#   causal +5-10% (fetch stalls), d128 level or lower (it loses ping-pong).
# This call: the GPU tests of both keys (every stress shape, both grids, packed batches), then d64 causal (the cell
# furthest behind: 0.89x cuDNN at 512 on Triton, 0.97-0.99x on Gluon from 2k) against the default, Triton and
# cuDNN in one process, three alternating rounds. n22.sh: the other head dims.
# Copy to .calls/ and run from the repository root: bash .calls/n21.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_gluon.py -k "first_tile_unmasked or wide_consumer" \
  2>&1 | tail -n 3 | tee -a $L
timeout 300 python3 scripts/ab_gluon.py --out $OUT/d64c --hdims 64 --causal yes --seqlens 512 1024 2048 4096 8192 \
  --rounds 3 --try ff:FIRST_FULL=1 wide:WIDE=1 wideff:WIDE=1,FIRST_FULL=1 wide64:WIDE=1,BLOCK_N=64 2>&1 \
  | grep -v Warn | tee -a $L
