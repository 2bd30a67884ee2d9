#!/usr/bin/env bash
# Issue 29 (session 23, call 3): score_mask's right window edge and the keys' end as one limit a query (one compare
# a score); GPU tests, then A/B of the two trees (.calls/base/src: HEAD before the change) by the package bench.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
grep -c "tl.minimum" src/flashattn2/kernels/device/mask.py .calls/base/src/flashattn2/kernels/device/mask.py | tee -a $L
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_gluon.py tests/test_features.py tests/test_attention_gpu.py \
  -k "forward_stress or window or causal or sliding or large_shapes" 2>&1 | tail -n 4 | tee -a $L
timeout 330 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/trees -- \
  --hdims 64 128 --modes fwd --causal 1 --seqlens 512 1024 2048 4096 2>&1 | grep -v Warn | tee -a $L
