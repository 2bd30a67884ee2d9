#!/usr/bin/env bash
# Session 34, call 01 (issue 27, MLA backward): DQ_WRITER (the producer warpgroup issues the dQ reduce-adds; the
# consumers stage, fence and arrive). GPU tests of the 192/128 backward with it and without, the A/B inside the whole
# backward beside cuDNN at 2k-16k, then the writer's tests with its address broken on purpose (they must fail).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/log.txt
timeout 240 python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_mla.py -k "unlike_value_head_dim" -rfE \
  > $OUT/tests.txt 2>&1
echo "tests rc=$?" | tee -a $OUT/log.txt; tail -n 4 $OUT/tests.txt | cut -c1-400 | tee -a $OUT/log.txt
timeout 300 python3 scripts/ab_mla_bwd.py --out $OUT --no-flex --rounds 6 --try writer:DQ_WRITER=1 \
  > $OUT/ab.txt 2>&1
echo "ab rc=$?" | tee -a $OUT/log.txt; grep "^s[0-9]\|FAILED\|WRONG" $OUT/ab.txt | cut -c1-400 | tee -a $OUT/log.txt
git apply .calls/break_writer.diff && echo "broken: head read from the batch slot" | tee -a $OUT/log.txt
timeout 150 python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_mla.py -k "unlike_value_head_dim and writer" \
  -rfE > $OUT/tests_broken.txt 2>&1
echo "broken tests rc=$?" | tee -a $OUT/log.txt; tail -n 3 $OUT/tests_broken.txt | cut -c1-300 | tee -a $OUT/log.txt
git apply -R .calls/break_writer.diff
