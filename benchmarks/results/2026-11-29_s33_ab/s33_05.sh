#!/usr/bin/env bash
# Session 33, call 05 (issue 29): call 04 found Gluon's three consumers at d64 non-causal 512 issuing 10% more
# instructions than cuDNN (82.7 M against 75.1 M: the last 192-row item's idle third), and two consumers (128-row
# items, cuDNN's tile) no faster (365 against 369 TFLOP/s, session 30). Here the stall reasons (--print-details all)
# of both Gluon tunings beside cuDNN's, each called twice (read the second).
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
S=$(date +%s)
python3 scripts/profile_gluon.py --case d64nc --fwd-tuning CONSUMERS=2+FREE_REGS=1 2>&1 | grep -v Warn | tail -3
for T in "" "CONSUMERS=2+FREE_REGS=1"; do
  N=three; [ -n "$T" ] && N=two
  timeout 200 ncu --clock-control none -k regex:'attention_fwd_sm90|cudnn' --section SpeedOfLight \
    --section WarpStateStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis \
    --print-details all python3 scripts/profile_gluon.py --case d64nc --fwd-tuning "$T" > $OUT/ncu_$N.txt 2>&1
  echo "ncu $N rc=$? $(( $(date +%s) - S )) s" | tee -a $L
  grep -E "^  [a-z].*\(|Duration|Executed Instructions  |Stall|stall" $OUT/ncu_$N.txt | head -60 | tee -a $L
done
