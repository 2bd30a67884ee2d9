#!/usr/bin/env bash
# Session 22 call 8. Issue 29: the Triton forward's short causal d64 tiles now up to 4,096 rows: the GPU tests that
# reach them (large shapes include 2 x 4096 causal d64), then the package's d64 causal forward against cuDNN.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_attention_gpu.py -k "large_shapes and 64" 2>&1 | tail -n 3 | tee -a $L
timeout 90 python3 -m flashattn2.bench --hdims 64 --dtypes bf16 --modes fwd --causal 1 --peers sdpa-cudnn --no-memory \
  --seqlens 512 1024 2048 4096 8192 --out-dir $OUT/bench --tag d64c 2>&1 | grep "^| 64" | tee -a $L
