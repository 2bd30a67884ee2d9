#!/usr/bin/env bash
# s27 call 7: where the cells stand at this session's tree (H200): the package bench, bf16, d64 / 128 / 256, both
# causal settings, 512-16k, forward then backward, cuDNN and SDPA's FLASH backend in the same run.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
timeout 240 python3 -m flashattn2.bench --hdims 64 128 256 --dtypes bf16 --modes fwd --peers sdpa-cudnn sdpa-flash \
  --no-memory --out-dir $OUT/r --tag h200_s27_fwd 2>&1 | grep -v Warn | grep -E "^\|" | tee -a $L
date -u | tee -a $L
timeout 290 python3 -m flashattn2.bench --hdims 64 128 256 --dtypes bf16 --modes bwd --peers sdpa-cudnn sdpa-flash \
  --no-memory --out-dir $OUT/r --tag h200_s27_bwd 2>&1 | grep -v Warn | grep -E "^\|" | tee -a $L
date -u | tee -a $L
