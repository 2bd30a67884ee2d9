#!/usr/bin/env bash
# Session 21, call 7 (H200): issue 27, three host/kernel keys of CONFIGS_MLA not measured on the 128-key MLA items or
# not since DQ_SPARE_SLOT: COALESCED_DKV (dK/dV through shared memory into 16-byte pieces), DQ_SPARE_SLOT off,
# PERSISTENT_CAUSAL (the scheduled persistent grid), at 2k and 4k causal, beside cuDNN.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
timeout 400 python3 scripts/ab_mla_bwd.py --out $OUT --seqlens 2048 4096 --try coal:COALESCED_DKV=1 spare0:DQ_SPARE_SLOT=0 pc:PERSISTENT_CAUSAL=1 --rounds 4 2>&1 | grep -v Warn | tee -a $L
date -u | tee -a $L
