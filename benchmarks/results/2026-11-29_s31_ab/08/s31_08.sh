#!/usr/bin/env bash
# Issue 27, latent: SPLIT_SCORES_FROM 256 (the seesaw from 256 keys a program) as the default. The latent GPU tests
# with it, then batches 1-32 (4k-64k, dense and paged): gluon (the new default), the old 4096, and 0 (the seesaw
# always), in turn on each row; eager and CUDA-graph times.
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py -k "latent or seesaw" -rfE 2>&1 | tail -n 4 | tee -a $L
mkdir -p $OUT/r
timeout 330 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 1,2,4,8,16,32 \
  --latent-backends gluon,gluon:SPLIT_SCORES_FROM=4096,gluon:SPLIT_SCORES_FROM=0 --out-dir $OUT/r \
  --tag h200_latent_seesaw_256 2>&1 | grep -v Warn | grep -E "latent|wrote|Error|error" | tee -a $L
