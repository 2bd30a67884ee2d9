#!/usr/bin/env bash
# Session 30 call 03: FP8's V copy through a cached Launch (v_copy_launch.diff) against kernel[grid], host time of
# v_keys_last alone (least of 7 batches of 500), base / diff / base / diff in fresh processes; then host_vs_gpu.py
# (now the least of 5 batches) on the base tree. Prediction: the Launch saves 5-15 us a copy on the host.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
for r in 1 2; do
  python3 .calls/v_copy_host.py base 2>&1 | grep -v Warn | tee -a $L
  git apply .calls/v_copy_launch.diff && { python3 .calls/v_copy_host.py launch 2>&1 | grep -v Warn | tee -a $L; git apply -R .calls/v_copy_launch.diff; }
done
timeout 200 python3 scripts/host_vs_gpu.py --out $OUT/host_vs_gpu.json 2>&1 | grep -v Warn | tee -a $L
