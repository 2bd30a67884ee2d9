#!/usr/bin/env bash
# Session 33, call 08 (issue 29): the package bench (auto's kernels) on the short bf16 forward cells below 1.0x cuDNN
# in session 30 (d64 and d256, 512 / 1k, causal and not), three trials, at bd713f3 (no kernel change since 7c93fd4).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $OUT/log.txt
timeout 200 python3 -m flashattn2.bench --seqlens 512 1024 --hdims 64 256 --dtypes bf16 --causal both --modes fwd \
  --peers sdpa-cudnn --trials 3 --no-memory --out-dir $OUT --tag s33_short 2>&1 | grep -v Warn | tail -n 30 | tee -a $OUT/log.txt
ls $OUT
