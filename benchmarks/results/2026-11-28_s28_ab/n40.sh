#!/usr/bin/env bash
# Issue 29 (d64 causal 512: 0.89x cuDNN on the Triton forward that auto runs there, H200 2026-11-28): what cuDNN's
# kernel does that ours does not. ncu on `profile_gluon.py --case d64c` (32 x 512, 32 heads: the bench's shape):
# the Gluon forward, the Triton forward (64, 64, 4, 3: 128 registers, 56 KB of shared memory, three programs an SM
# by shared memory) and cuDNN's, each launched twice (the second read). Reading: grid and block sizes, registers,
# shared memory, achieved occupancy, duration, issue-slot use and stall reasons of each. About 90 s.
# Copy to .calls/ and run from the repository root: bash .calls/n40.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
timeout 200 $N --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  --section SchedulerStats -k regex:'attention|cudnn|fmha|sdpa' -o /tmp/rep_d64c \
  python3 scripts/profile_gluon.py --case d64c > /tmp/ncu_d64c.log 2>&1
tail -n 5 /tmp/ncu_d64c.log | tee -a $L
$N -i /tmp/rep_d64c.ncu-rep --page details > $OUT/ncu_d64c.txt 2>&1
grep -E "^  [a-z_]|Duration|Registers Per|Block Size|Grid Size|Shared Memory Config|Dynamic Shared|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" \
  $OUT/ncu_d64c.txt | tee -a $L
