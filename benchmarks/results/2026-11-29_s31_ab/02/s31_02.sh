#!/usr/bin/env bash
# n64 (racecheck of the Gluon backward, MLA and sink families, each triaged), then test_fp8 on the GPU (the
# v_keys_last cache test of review mend 7280543 has run only on CPU).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
TOOLS=racecheck SANITIZE_TIMEOUT=140 timeout 470 bash scripts/sanitize.sh bwd-gluon mla-gluon sinks-mla 2>&1 | tee -a $L
for f in bwd-gluon mla-gluon sinks-mla; do
  python3 scripts/racecheck_triage.py $OUT/racecheck-$f.log 2>&1 | tee -a $L
done
timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py -rfE 2>&1 | tail -n 5 | tee -a $L
