#!/usr/bin/env bash
# Session 21, call 8 (H200): issue 27, call 7's two leaders again and together, 2k-16k, six rounds: PERSISTENT_CAUSAL
# (0.974 / 0.985 of base's time at 2k / 4k) and COALESCED_DKV (0.981 / 0.992), beside cuDNN.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
timeout 400 python3 scripts/ab_mla_bwd.py --out $OUT --try pc:PERSISTENT_CAUSAL=1 coal:COALESCED_DKV=1 both:PERSISTENT_CAUSAL=1,COALESCED_DKV=1 --rounds 6 2>&1 | grep -v Warn | tee -a $L
date -u | tee -a $L
