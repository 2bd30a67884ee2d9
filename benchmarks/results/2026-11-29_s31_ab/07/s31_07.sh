#!/usr/bin/env bash
# Issue 27, latent at batch 1 and 8: the seesaw below SPLIT_SCORES_FROM=4096 keys a program (unmeasured there; the
# split calls of batch 1-8 now take the one-scores-warpgroup schedule). Each row: auto, gluon (default 4096),
# gluon with the seesaw from 1024 and from 256 keys a program, in turn; eager and CUDA-graph times.
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
mkdir -p $OUT/r
timeout 400 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 1,8 \
  --latent-backends auto,gluon,gluon:SPLIT_SCORES_FROM=1024,gluon:SPLIT_SCORES_FROM=256 --out-dir $OUT/r \
  --tag h200_latent_seesaw_from 2>&1 | grep -v Warn | grep -E "latent|wrote|Error|error" | tee -a $L
