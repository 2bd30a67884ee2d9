#!/usr/bin/env bash
# Session 30 call 07: compute-sanitizer memcheck and racecheck on the Triton forward's one-loop rows (d64 / d256 causal,
# sessions 27-28) and the Triton FP8 rows of sessions 28-29 (scripts/sanitize.py's fwd-triton and fp8 families, widened
# this session); the last full pass (2026-11-27) predates them.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $OUT/log.txt
SANITIZE_TIMEOUT=150 bash scripts/sanitize.sh fwd-triton fp8 2>&1 | tee -a $OUT/log.txt
