#!/usr/bin/env bash
# Session 22 call 10. Issue 29: the Triton forward's query tiles launched in reverse for causal calls (FwdConfig
# reverse_m, off by default): its test on the GPU, then an interleaved A/B at d64 causal 512-4k against today's
# tiles (prediction: 1-3%, the last wave filled by the shortest tiles instead of the longest).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_attention.py -k reverse 2>&1 | tail -n 2 | tee -a $L
timeout 120 python3 scripts/ab_triton_fwd.py --hdim 64 --causal --seqlens 512 1024 2048 4096 --rounds 6 \
  --configs "64,64,4,3;64,64,4,3,0,1" --out $OUT/rev_d64c.json 2>&1 | grep -v Warn | tail -n 5 | tee -a $L
