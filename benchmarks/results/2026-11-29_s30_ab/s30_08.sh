#!/usr/bin/env bash
# Session 30 call 08: compute-sanitizer memcheck, then racecheck, on the Gluon forward family (scripts/sanitize.py
# fwd-gluon: d128 dense and causal on the persistent / scheduled grids, packed d64 causal), whose code changed since
# the last full pass (2026-11-27: score_mask's one limit, P packed by cvt.rn.bf16x2, FIRST_FULL and WIDE's switches).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $OUT/log.txt
SANITIZE_TIMEOUT=110 timeout 270 bash scripts/sanitize.sh fwd-gluon 2>&1 | tee -a $OUT/log.txt
