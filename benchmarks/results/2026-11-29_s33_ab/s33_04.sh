#!/usr/bin/env bash
# Session 33, call 04 (issue 29): ncu of the d64 non-causal 512 forward (32 x 512, 32 heads, the package bench's
# cell at 0.94-0.96x cuDNN): Gluon's three consumers (auto's kernel), the Triton forward, then cuDNN's; each called
# twice (read the second). Where Gluon's warps stall against cuDNN's, for the next route.
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
S=$(date +%s)
python3 scripts/profile_gluon.py --case d64nc 2>&1 | grep -v Warn | tail -3   # compile outside ncu
timeout 400 ncu --clock-control none -k regex:'attention|cudnn|fmha|sdpa|flash' --section SpeedOfLight \
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
  --section InstructionStats --section ComputeWorkloadAnalysis python3 scripts/profile_gluon.py --case d64nc \
  > $OUT/ncu_d64nc.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s" | tee -a $L
grep -E "attention|cudnn|fmha|sdpa|flash|Duration|No Eligible|Issued Warp|Warp Cycles Per Issued|Registers Per|Executed Ipc A" $OUT/ncu_d64nc.txt | head -80 | tee -a $L
