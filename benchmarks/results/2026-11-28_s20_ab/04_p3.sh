#!/usr/bin/env bash
# Session 20, call 4 (H100): issue 29's cells at HEAD: the bf16 forward against cuDNN (d64/128/256, 512-16k,
# causal and not), then FP8 d128/d256 512-16k against FlashAttention-3's figures with the same run's FP8 matmul.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/f $OUT/p
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 240 python3 -m flashattn2.bench --hdims 64 128 256 --dtypes bf16 --modes fwd --peers sdpa-cudnn --no-memory --out-dir $OUT/f 2>&1 | grep -v Warn | tail -n 30 | tee -a $L
timeout 240 python3 benchmarks/bench_fp8.py --head-dims 128 256 --no-accuracy --seqlens 512 1024 2048 4096 8192 16384 --out-dir $OUT/p 2>&1 | grep -v Warn | tail -n 40 | tee -a $L
ls $OUT/f $OUT/p | tee -a $L
date -u | tee -a $L
