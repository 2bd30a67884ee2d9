#!/usr/bin/env bash
# Session 34, call 07 (issue 27): the MLA backward on packed (varlen) calls, whose items keep one program each, with
# the landed DQ_WRITER / DQ_PAIR against the last tuning: 16k tokens as 4 documents a length (2k and 4k documents),
# 8 alternating rounds, no peer (cuDNN's SDPA takes no packed batch).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 200 python3 scripts/ab_mla_bwd.py --out $OUT --no-flex --packed 4 --seqlens 8192 16384 --rounds 8 \
  --try last:DQ_WRITER=0,DQ_PAIR=0 > $OUT/ab.txt 2>&1
echo "ab rc=$?" | tee $OUT/log.txt; grep "^s[0-9]\|FAILED\|WRONG\|Error" $OUT/ab.txt | cut -c1-400 | tee -a $OUT/log.txt
tail -n 3 $OUT/ab.txt | cut -c1-300 | tee -a $OUT/log.txt
