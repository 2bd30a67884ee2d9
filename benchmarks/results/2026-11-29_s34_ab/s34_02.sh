#!/usr/bin/env bash
# Session 34, call 02 (issue 27, MLA backward): DQ_WRITER=2, a trial: the producer's reduce-adds as in call 01, and
# warpgroup 0 keeps both its dQ chunks' matmuls in flight before it stores either. Its GPU tests (the writer item
# run with DQ_WRITER=2 by a sed on this copy), then the A/B: base, writer (1), writer + pair (2), cuDNN, 8 rounds.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/log.txt
sed -i 's/DQ_WRITER=not config.get("DQ_WRITER")/DQ_WRITER=2/' tests/test_mla.py
timeout 200 python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_mla.py -k "unlike_value_head_dim and writer" \
  -rfE > $OUT/tests.txt 2>&1
echo "tests rc=$?" | tee -a $OUT/log.txt; tail -n 3 $OUT/tests.txt | cut -c1-400 | tee -a $OUT/log.txt
sed -i 's/DQ_WRITER=2/DQ_WRITER=not config.get("DQ_WRITER")/' tests/test_mla.py
timeout 360 python3 scripts/ab_mla_bwd.py --out $OUT --no-flex --rounds 8 --try writer:DQ_WRITER=1 pair:DQ_WRITER=2 \
  > $OUT/ab.txt 2>&1
echo "ab rc=$?" | tee -a $OUT/log.txt; grep "^s[0-9]\|FAILED\|WRONG" $OUT/ab.txt | grep -v flex | cut -c1-400 | tee -a $OUT/log.txt
