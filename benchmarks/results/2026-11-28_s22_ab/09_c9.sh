#!/usr/bin/env bash
# Session 22 call 9. Issue 29: why the package bench (call 8) shows no gain at 2k / 4k where the kernel A/B did:
# flash_attn_func beside the two configs and cuDNN, interleaved, in one process.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
timeout 100 python3 scripts/ab_triton_fwd.py --hdim 64 --causal --seqlens 2048 4096 --rounds 8 \
  --configs "128,64,8,3;64,64,4,3" --out $OUT/triton_d64c.json 2>&1 | grep -v Warn | tail -n 3 | tee -a $L
