#!/usr/bin/env bash
# Issue 29 (any sm_90 card, about 120 s): is the forward's exp2 (MUFU) the limit where exps per matmul FLOP are
# highest? Per 64-row tile of keys, the tensor-core time of the two matmuls against MUFU's 16 exp2 a clock and SM:
# FP8 d64 2:1 for MUFU, FP8 d128 and bf16 d64 1:1, bf16 d128 1:2. If MUFU's pipe is near its peak in the FP8 d64 /
# d128 kernels while the tensor pipe idles, computing part of the exps by a polynomial on the FMA pipe
# (FlashAttention-4's route on Blackwell) is the next A/B; if the issue slots are full instead, it is not.
# ncu on `profile_gluon.py --case pipes` (each call twice; read the second): FP8 d64 4k (Triton, what auto runs),
# bf16 d64 4k (Gluon, three consumers), FP8 d128 16k (Gluon), cuDNN bf16 d64 4k.
# Reading: per kernel the duration, issue slots busy, and each pipe's share of its peak (xu = MUFU, fma, alu, the
# tensor pipes), from the raw page.
# Copy to .calls/ and run from the repository root: bash .calls/n60.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
# the FP8 repeat cache (interface._seen for FP8 calls, landed after the session's last device call): the FP8 GPU tests
timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py tests/test_host.py 2>&1 | tail -n 2 | tee -a $L
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
timeout 300 $N --section ComputeWorkloadAnalysis --section InstructionStats --section SpeedOfLight \
  -k regex:'attention|cudnn|fmha|sdpa' -o /tmp/rep_pipes python3 scripts/profile_gluon.py --case pipes \
  > /tmp/ncu_pipes.log 2>&1
tail -n 5 /tmp/ncu_pipes.log | tee -a $L
$N -i /tmp/rep_pipes.ncu-rep --page details > $OUT/ncu_pipes_details.txt 2>&1
$N -i /tmp/rep_pipes.ncu-rep --page raw > $OUT/ncu_pipes_raw.txt 2>&1
grep -E "^  [a-zA-Z_]|Duration|Issue Slots Busy|Executed Ipc Active|SM Busy" $OUT/ncu_pipes_details.txt | tee -a $L
grep -E "^  [a-zA-Z_]|pipe_(xu|fma|alu|fmaheavy|tensor|shared).*(pct_of_peak|active)|issue_active" \
  $OUT/ncu_pipes_raw.txt | grep -v "per_second" | head -n 200 | tee -a $L
# then: is the package's short FP8 call bound by its host time? (ab_triton_fwd.py's package column read d128 FP8 512
# at 0.186 ms where the kernel it ran reads 0.150 called directly; session 29, NOTES.md)
timeout 120 python3 scripts/host_vs_gpu.py --out $OUT/host_vs_gpu.json 2>&1 | grep -v Warn | tee -a $L
# then the V copy through a cached Launch (v_copy_launch.diff, prepared here: kernel[grid] binds its arguments on
# every call): the FP8 GPU tests and the host times again, with it applied to this copy of the tree
git apply benchmarks/results/2026-11-29_s29_prepared/v_copy_launch.diff && {
  timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py 2>&1 | tail -n 2 | tee -a $L
  timeout 120 python3 scripts/host_vs_gpu.py --out $OUT/host_vs_gpu_v_launch.json 2>&1 | grep -v Warn | tee -a $L
  git apply -R benchmarks/results/2026-11-29_s29_prepared/v_copy_launch.diff; }
