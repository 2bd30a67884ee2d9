#!/usr/bin/env bash
# Session 24 call 4: the tree to land (fwd_half2 + fwd_out_reciprocal): the GPU tests n6 left out (Triton forward,
# flex, FP8, small calls, SDPA backend, features), then the forward tree A/B at d256.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
grep -c "to_half2" src/flashattn2/kernels/sm90/forward.py | tee -a $L
timeout 280 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_attention_gpu.py tests/test_flex.py \
  tests/test_fp8.py tests/test_small_calls_gpu.py tests/test_sdpa_backend.py tests/test_features.py \
  tests/test_long_rows.py 2>&1 | tail -n 4 | tee -a $L
timeout 150 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/fwd -- \
  --hdims 256 --modes fwd --causal both --seqlens 512 2048 2>&1 | grep -v Warn | tee -a $L
rm -f $OUT/fwd/base*.json $OUT/fwd/new0.json $OUT/fwd/new1.json
