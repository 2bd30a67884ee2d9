#!/usr/bin/env bash
# Any sm_90 card, about 500 s: complete the sanitizer pass on the Gluon kernels changed since the last full pass
# (2026-11-27): racecheck on the forward family (cut at 110 s in session 30's call 08, 469 reports, all ws-state),
# then memcheck on the backward, MLA and sink families (the scheduled / placed grids, COALESCED_DKV, the masks).
# Every racecheck log goes through racecheck_triage.py; exit 1 there names an unexplained report.
# Copy to .calls/ and run from the repository root: bash .calls/n63_sanitize_gluon.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
OUT=$OUT/fwd TOOLS=racecheck SANITIZE_TIMEOUT=330 timeout 400 bash scripts/sanitize.sh fwd-gluon 2>&1 | tee -a $L
python3 scripts/racecheck_triage.py $OUT/fwd/racecheck-fwd-gluon.log 2>&1 | tee -a $L
OUT=$OUT/bwd TOOLS=memcheck SANITIZE_TIMEOUT=60 timeout 180 bash scripts/sanitize.sh bwd-gluon mla-gluon sinks-mla 2>&1 \
  | tee -a $L
