#!/usr/bin/env bash
# Session 21, call 10 (H200): issue 29's cells at HEAD (the d64 causal short tiles in): bf16 forward against cuDNN at
# d64/128/256, causal and not, 512-16k; FP8 at d128/d256 against FA3's published figures.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/f $OUT/p
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
git log --oneline 2>/dev/null | head -n 1 | tee -a $L
date -u | tee -a $L
timeout 200 python3 -m flashattn2.bench --hdims 64 128 256 --dtypes bf16 --modes fwd --peers sdpa-cudnn --no-memory --out-dir $OUT/f 2>&1 | grep -v Warn | grep -E "^\|" | tee -a $L
date -u | tee -a $L
timeout 200 python3 benchmarks/bench_fp8.py --head-dims 128 256 --no-accuracy --seqlens 512 1024 2048 4096 8192 16384 --out-dir $OUT/p 2>&1 | grep -v Warn | tail -n 30 | tee -a $L
date -u | tee -a $L
