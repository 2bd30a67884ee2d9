#!/usr/bin/env bash
# session 29 call 02 (issue 29, FP8 non-causal short calls on the Triton FP8 kernel's 64-row tiles; ~250 s).
# Call 01 found Triton (64,64)/(64,128) ahead of the Gluon FP8 forward (the package column) at d64 non-causal
# 512-2k (0.89/0.83/0.88 its time) and d128 512 (0.955), behind at d128 1k. Here: the crossover at d64 (4k-16k),
# one loop or two for non-causal, d128 512-1k again, d256 512-2k (FA3's figure 510/744/931 TFLOP/s; Gluon 0.94-0.99
# of it). Predictions: d64 crossover at 4k-8k; d256 (64,64,4,2) ahead of Gluon at 512, behind from 2k.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
AB="timeout 150 python3 scripts/ab_triton_fwd.py --rounds 5 --fp8"
echo "== 1 fp8 d64 non-causal long" | tee -a $L
$AB --hdim 64 --seqlens 4096 8192 16384 --configs "64,128,4,3;64,128,4,3,0,1;64,64,4,3;128,128,8,3" --out $OUT/ab1.json 2>&1 | grep -v Warn | tee -a $L
echo "== 2 fp8 d64 non-causal short, one loop" | tee -a $L
$AB --hdim 64 --seqlens 512 1024 2048 --configs "64,64,4,3;64,64,4,3,0,1;64,128,4,3;64,128,4,3,0,1" --out $OUT/ab2.json 2>&1 | grep -v Warn | tee -a $L
echo "== 3 fp8 d128 non-causal" | tee -a $L
$AB --hdim 128 --seqlens 512 768 1024 --configs "64,64,4,3;64,64,4,3,0,1;64,128,4,3;64,64,4,4" --out $OUT/ab3.json 2>&1 | grep -v Warn | tee -a $L
echo "== 4 fp8 d256 non-causal" | tee -a $L
$AB --hdim 256 --seqlens 512 1024 2048 --configs "128,64,8,2;64,64,4,2;64,64,4,2,0,1;64,128,4,2;64,64,4,3" --out $OUT/ab4.json 2>&1 | grep -v Warn | tee -a $L
