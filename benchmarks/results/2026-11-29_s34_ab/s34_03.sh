#!/usr/bin/env bash
# Session 34, call 03 (issue 27, MLA backward): DQ_PAIR (warpgroup 0 keeps both its dQ chunks' matmuls in flight
# before it stages either) on its own, and with DQ_WRITER. GPU tests of both items, then the A/B against the base
# and cuDNN, 8 alternating rounds at 2k-16k.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/log.txt
timeout 200 python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_mla.py \
  -k "unlike_value_head_dim and (paired or writer)" -rfE > $OUT/tests.txt 2>&1
echo "tests rc=$?" | tee -a $OUT/log.txt; tail -n 3 $OUT/tests.txt | cut -c1-400 | tee -a $OUT/log.txt
timeout 360 python3 scripts/ab_mla_bwd.py --out $OUT --no-flex --rounds 8 --try pair:DQ_PAIR=1 \
  wpair:DQ_WRITER=1,DQ_PAIR=1 > $OUT/ab.txt 2>&1
echo "ab rc=$?" | tee -a $OUT/log.txt; grep "^s[0-9]\|FAILED\|WRONG" $OUT/ab.txt | grep -v flex | cut -c1-400 | tee -a $OUT/log.txt
