#!/usr/bin/env bash
# Any sm_90 card, about 300 s: issue 27's latent decoding at small batches, now that every call takes the seesaw.
# 1) auto's rule for small calls (AUTO_MIN_KEYS: below 32,768 cached key positions over the batch auto keeps the
#    Triton kernel): Triton against Gluon at batch 1-4, 4k-16k, eager and CUDA-graph times. Session 31's call 07
#    read Gluon's kernel time 1.14-1.43x faster at batch 1 (graph), and eager either way by the host's speed
#    (Gluon's launch expands two TMA descriptors: 20-30 µs more host time).
# 2) the split count at batches 1-32 (0: the package's one wave of programs), eager and graph.
# Copy to .calls/ and run from the repository root: bash .calls/n70_latent_small.sh
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
# first the GPU tests of this session's host rules (run on CPU only so far): empty calls under "gluon", the empty
# latent cache
timeout 120 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_attention.py tests/test_mla.py \
  -k "empty_calls or empty_cache" -rfE 2>&1 | tail -n 3 | tee -a $L
mkdir -p $OUT/r
timeout 150 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 1,2,4 --latent-backends triton,gluon \
  --out-dir $OUT/r --tag latent_auto_small 2>&1 | grep -v Warn | grep -E "latent|wrote|Error|error" | tee -a $L
timeout 200 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 1,8,32 --latent-splits 0,4,16,33,132 \
  --out-dir $OUT/r --tag latent_splits 2>&1 | grep -v Warn | grep -E "latent|wrote|Error|error" | tee -a $L
