#!/usr/bin/env bash
# Session 26, call 05: the whole GPU suite forced to Gluon, with its count, on the tree landing FIRST_FULL (d64 causal
# from 1k rows) and PLACED_SCHEDULE (MLA short causal backward). About 360 s on an H200 with 14 workers.
# out). About 360 s on an H200 with 14 workers. Run on the tree that lands FIRST_FULL / WIDE, if either does.
# Copy to .calls/ and run from the repository root: bash .calls/n23.sh (the default backend: FLASHATTN2_BACKEND=auto)
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 FLASHATTN2_BACKEND=${FLASHATTN2_BACKEND:-gluon}
L=$OUT/log.txt
echo "FLASHATTN2_BACKEND=$FLASHATTN2_BACKEND" | tee $L
timeout 540 python3 -m pytest -q -n 14 -p no:cacheprovider tests -rf > $OUT/pytest.txt 2>&1
echo "pytest exit $?" | tee -a $L
grep -E "^(FAILED|ERROR)|passed|failed|skipped:" $OUT/pytest.txt | tail -n 30 | tee -a $L
