#!/usr/bin/env bash
# Any sm_90 card, about 500 s: racecheck on the Gluon backward, MLA and sink families (after n63's memcheck), each
# log through racecheck_triage.py.
# Copy to .calls/ and run from the repository root: bash .calls/n64_racecheck_bwd.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
TOOLS=racecheck SANITIZE_TIMEOUT=150 timeout 520 bash scripts/sanitize.sh bwd-gluon mla-gluon sinks-mla 2>&1 | tee -a $L
for f in bwd-gluon mla-gluon sinks-mla; do
  python3 scripts/racecheck_triage.py $OUT/racecheck-$f.log 2>&1 | tee -a $L
done
