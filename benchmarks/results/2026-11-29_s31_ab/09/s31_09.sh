#!/usr/bin/env bash
# Issue 27, latent: SPLIT_SCORES_FROM 0 (the seesaw for every call) as the default. test_mla.py on the GPU (the
# latent items now force their schedules through SPLIT_SCORES_FROM), then batches 1-2 with the default against 4096.
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 170 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py -rfE 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -n 12 | tee -a $L
mkdir -p $OUT/r
timeout 90 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 1,2 \
  --latent-backends gluon,gluon:SPLIT_SCORES_FROM=4096 --out-dir $OUT/r \
  --tag h200_latent_seesaw_0 2>&1 | grep -v Warn | grep -E "latent|wrote|Error|error" | tee -a $L
