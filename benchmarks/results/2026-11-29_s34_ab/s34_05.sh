#!/usr/bin/env bash
# Session 34, call 05: the whole GPU suite under auto at 43fb1c0 (DQ_WRITER / DQ_PAIR landed; every Gluon backward's
# shared-memory aggregate and producer changed), test_long_rows left out (session 33 ran it at 43b4e95).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
S=$(date +%s)
FLASHATTN2_BACKEND=auto timeout 540 python3 -m pytest -q -n 16 -p no:cacheprovider tests \
  --ignore=tests/test_long_rows.py -rfE > $OUT/suite.txt 2>&1
echo "suite rc=$? $(( $(date +%s) - S )) s" | tee $OUT/log.txt; tail -n 4 $OUT/suite.txt | cut -c1-600 | tee -a $OUT/log.txt
grep "^FAILED\|^ERROR" $OUT/suite.txt | head -20 | tee -a $OUT/log.txt
