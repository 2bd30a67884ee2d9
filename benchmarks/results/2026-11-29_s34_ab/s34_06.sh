#!/usr/bin/env bash
# Session 34, call 06: compute-sanitizer memcheck and racecheck on the MLA Gluon family at 43fb1c0 (DQ_WRITER's new
# hand-offs: the staged dQ sets, their address in dq_at, dq_full / dq_empty), racecheck's reports through the triage.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=$OUT TOOLS="memcheck racecheck" SANITIZE_TIMEOUT=170 timeout 420 bash scripts/sanitize.sh mla-gluon \
  > $OUT/sanitize.txt 2>&1
echo "sanitize rc=$?" | tee $OUT/log.txt; cat $OUT/summary.txt | tee -a $OUT/log.txt
python3 scripts/racecheck_triage.py $OUT/racecheck-mla-gluon.log 2>&1 | tail -n 25 | tee -a $OUT/log.txt
echo "-- with the dq_at hand-off named (store at backward.py:687, load at :326, ordered by dq_full / dq_empty)" | tee -a $OUT/log.txt
python3 scripts/racecheck_triage.py $OUT/racecheck-mla-gluon.log --ordered backward.py:687,backward.py:326 2>&1 \
  | tail -n 12 | tee -a $OUT/log.txt
