#!/usr/bin/env bash
# s27 call 9 (issue 29): auto's d64 causal rule from 2048 to 1024 query rows (Gluon from 1k). Tree A/B through the
# package bench (base: HEAD 75611bb's src, new: the working tree), d64 causal 1k / 1.5k / 2k, three rounds; then the
# GPU tests under auto that reach the forward at d64 causal.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 200 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/trees -- \
  --hdims 64 --modes fwd --causal 1 --seqlens 1024 1536 2048 2>&1 | grep -v Warn | tail -n 8 | tee -a $L
timeout 170 python3 -m pytest -q -n 14 -p no:cacheprovider tests/test_attention_gpu.py tests/test_small_calls_gpu.py \
  2>&1 | tail -n 3 | tee -a $L
timeout 60 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_gluon.py -k "auto or backend or first_tile" \
  2>&1 | tail -n 3 | tee -a $L
