#!/usr/bin/env bash
# Session 33, call 03: test_long_rows alone (not run since d9b0912's kept descriptors), and the first failing DEFER_O
# test of call 02 with its whole report (call 02 kept only the tail; DEFER_O is rejected on speed either way).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
S=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_long_rows.py -rfE 2>&1 | tail -n 5 | tee -a $L
echo "long_rows $(( $(date +%s) - S )) s" | tee -a $L
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_gluon.py -k "defers_each and persistent and 129x4000" > $OUT/defer_fail.txt 2>&1
echo "defer rc=$? $(( $(date +%s) - S )) s" | tee -a $L
grep -n "Error\|assert\|mismatch\|max\|FAILED" $OUT/defer_fail.txt | head -30 | tee -a $L
