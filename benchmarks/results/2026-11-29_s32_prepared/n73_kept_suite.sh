#!/usr/bin/env bash
# Any sm_90 card, about 500 s on a cold machine: session 32's descriptor change, finished.
# 1) host time of Gluon calls with the launches' kept descriptors against Triton's launcher encoding them each call,
#    alternating in one process (session 32's A/B ran the arms in separate processes, whose spread matched the
#    effect). Prediction: kept 10-20 µs less a latent call (two descriptors), 15-35 µs less a forward (four) and a
#    forward+backward (four + five).
# 2) test_long_rows alone (not run since the change), then the whole suite under auto (session 32's call 03 ran
#    ~99% of it before its limit, cold).
# Copy to .calls/ and run from the repository root: bash .calls/n73_kept_suite.sh
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 120 python3 scripts/host_vs_gpu.py --kept-ab --out $OUT/kept_ab.json 2>&1 | grep -v Warn | tee -a $L
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_long_rows.py -rfE 2>&1 | tail -n 3 | tee -a $L
timeout 420 python3 -m pytest -q -n 16 -p no:cacheprovider tests --ignore=tests/test_long_rows.py -rfE > $OUT/suite_auto.txt 2>&1
echo "suite under auto rc=$?" | tee -a $L; tail -n 3 $OUT/suite_auto.txt | tee -a $L
