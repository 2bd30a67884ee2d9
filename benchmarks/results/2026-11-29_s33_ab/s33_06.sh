#!/usr/bin/env bash
# Session 33, call 06 (issue 29): where the d64 non-causal 512 forward's warps stall, SASS line by line (ncu source
# page), for two consumers (cuDNN's tile: fewer instructions than cuDNN's, 191 against 180 us, long-scoreboard
# stalls 2.04 a warp-instruction against 0.58) and the default three. Second launch of each.
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
S=$(date +%s)
python3 scripts/profile_gluon.py --case d64nc --fwd-tuning CONSUMERS=2+FREE_REGS=1 2>&1 | grep -v Warn | tail -3
for T in "CONSUMERS=2+FREE_REGS=1" ""; do
  N=three; [ -n "$T" ] && N=two
  timeout 200 ncu --clock-control none -k regex:attention_fwd_sm90 --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats -o /tmp/rep_$N python3 scripts/profile_gluon.py --case d64nc \
    --fwd-tuning "$T" > /tmp/ncu_$N.log 2>&1
  echo "ncu $N rc=$? $(( $(date +%s) - S )) s" | tee -a $L; tail -n 3 /tmp/ncu_$N.log
  ncu -i /tmp/rep_$N.ncu-rep --page source --csv --print-source sass > /tmp/src_$N.csv 2>/tmp/src_$N.err
  echo "source rc=$? $(wc -c < /tmp/src_$N.csv) bytes"; head -c 600 /tmp/src_$N.err
  python3 .calls/top_stalls.py /tmp/src_$N.csv 80 > $OUT/top_$N.txt 2>&1; head -n 30 $OUT/top_$N.txt | cut -c1-300 | tee -a $L
  gzip -c /tmp/src_$N.csv > $OUT/src_$N.csv.gz
done
ls -la $OUT
