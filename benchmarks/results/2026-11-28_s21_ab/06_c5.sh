#!/usr/bin/env bash
# Session 21, call 6 (H200): issue 27, the MLA backward's causal grid in L2-sized sections (longest items first over a
# section's heads, as d64/d128 do) against one head after another (CONFIGS_MLA's L2_SECTIONS=0), beside cuDNN.
# A list-scheduling model of 132 SMs predicts +5% / +7% / +5% / 0 at 2k / 4k / 8k / 16k with the whole L2's share.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
timeout 400 python3 scripts/ab_mla_bwd.py --out $OUT --try sec1:L2_SECTIONS=1 sec2:L2_SECTIONS=2 --rounds 4 2>&1 | grep -v Warn | tee -a $L
date -u | tee -a $L
