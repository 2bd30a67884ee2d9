#!/usr/bin/env bash
# Session 30 call 04 (issue 29's test line): the whole GPU suite with the backend auto picks (16 workers; run again with 545 s after a 400 s run reached 85%, no failure;
# test_long_rows alone after it), on the tree with sessions 27-30's forward rows and the V copy's Launch.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 FLASHATTN2_BACKEND=${FLASHATTN2_BACKEND:-auto}
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
echo "FLASHATTN2_BACKEND=$FLASHATTN2_BACKEND" | tee -a $L
timeout 545 python3 -m pytest -q -n 16 -p no:cacheprovider tests --ignore=tests/test_long_rows.py -rfE > $OUT/pytest.txt 2>&1
echo "pytest exit $?" | tee -a $L
grep -E "^(FAILED|ERROR)|passed|failed|skipped:" $OUT/pytest.txt | tail -n 30 | tee -a $L



