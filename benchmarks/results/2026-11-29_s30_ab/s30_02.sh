#!/usr/bin/env bash
# Session 30 call 02 (issue 29, H200): two cp.async stages instead of three on the bf16 d64 Triton forward's 64-row
# tiles. Same 128 registers (four programs an SM by registers either way), shared memory 56 -> 40 KB (three programs an
# SM by shared memory -> four): more warps to hide the softmax's latency (ncu of call 01: MUFU 60%, issue slots 57%,
# tensor 29% in the FP8 d64 kernel, so it waits rather than saturates a pipe). Prediction: +3-6% at d64 causal and
# non-causal 512 / 1k, level or slower from 2k.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
python3 scripts/ab_triton_fwd.py --hdim 64 --causal --seqlens 512 768 1024 2048 --configs "64,64,4,3,0,1;64,64,4,2,0,1" \
  --rounds 6 --out $OUT/d64c_stages.json 2>&1 | grep -v Warn | tee -a $L
python3 scripts/ab_triton_fwd.py --hdim 64 --seqlens 512 1024 2048 --configs "64,64,4,3;64,64,4,2;64,64,4,2,0,1" \
  --rounds 6 --out $OUT/d64nc_stages.json 2>&1 | grep -v Warn | tee -a $L
