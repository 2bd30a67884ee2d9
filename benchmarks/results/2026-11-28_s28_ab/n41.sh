#!/usr/bin/env bash
# Issue 29 (d64 causal below 1k rows, on the Triton forward: 0.89x cuDNN at 512, H200 2026-11-28): FwdConfig.one_loop
# (landed off in 4178d67): the key tiles of an item as one loop, the diagonal and the keys' end masked by
# a uniform branch, so that the cp.async pipeline fills once an item instead of once for the unmasked tiles and once
# for the masked one. sm_90 (triton 3.6, the launch's divisibility marks): (64, 64, 4, 3) 1,448 -> 1,008 SASS
# instructions, 12 -> 6 cp.async sites, 128 registers both, no spills, 56 KB. An item at 512 rows holds 1-8 key
# tiles (4.5 on average), so a second pipeline fill is a large share. Prediction: +3-8% at 512, +2-4% at 768,
# level from 2k. GPU tests of the path, then ab_triton_fwd in six alternating rounds. About 150 s.
# Copy to .calls/ and run from the repository root: bash .calls/n41.sh
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_attention.py -k "one_key_loop" 2>&1 | tail -n 3 | tee -a $L
timeout 200 python3 scripts/ab_triton_fwd.py --hdim 64 --causal --seqlens 512 768 1024 2048 --rounds 6 \
  --configs "64,64,4,3;64,64,4,3,0,1" --out $OUT/ab_one_loop.json 2>&1 | grep -v Warn | tee -a $L
