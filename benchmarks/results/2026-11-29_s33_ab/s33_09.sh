#!/usr/bin/env bash
# Session 33, call 09 (issue 27, prepared TMA_DKV, off by default): its GPU tests against float64 on the device
# time left (d64 / d128 stress shapes, both grids, fused dQ and deterministic; MLA 192/128 dense and packed).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 165 python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_gluon.py tests/test_mla.py \
  -k "tma and stores" -rfE > $OUT/tests.txt 2>&1
echo "rc=$?" | tee $OUT/log.txt; tail -n 6 $OUT/tests.txt | cut -c1-400 | tee -a $OUT/log.txt
