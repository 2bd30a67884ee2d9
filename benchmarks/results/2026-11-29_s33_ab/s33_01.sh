#!/usr/bin/env bash
# Session 33, call 01: the whole GPU suite under auto, run to its end on a cold machine (session 32's call 03 reached
# ~99% in 420 s), after d9b0912 (kept descriptors) and f69c1aa (auto takes the Gluon latent kernel).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
S=$(date +%s)
timeout 560 python3 -m pytest -q -n 16 -p no:cacheprovider tests --ignore=tests/test_long_rows.py -rfE > $OUT/suite_auto.txt 2>&1
echo "suite under auto rc=$? $(( $(date +%s) - S )) s" | tee -a $L; tail -n 3 $OUT/suite_auto.txt | tee -a $L
