#!/usr/bin/env bash
# s28 call 04 (issue 29, FP8): the FP8 d64 causal Triton tile (64, 64, 4, 3, one loop) won 0.70 / 0.76 at 512 / 1k
# over (128, 128, 8, 3): where does it stand against the Gluon FP8 forward that auto runs from 2k rows, and at d128 /
# d256 causal short, where auto runs Gluon from 0 rows?
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
AB="timeout 150 python3 scripts/ab_triton_fwd.py --causal --fp8 --rounds 5"
echo "== fp8 d64 causal, 2k-8k" | tee -a $L
$AB --hdim 64 --seqlens 1536 2048 4096 8192 --configs "128,128,8,3,0,1;64,64,4,3,0,1;64,128,4,3,0,1;128,64,8,3,0,1" --out $OUT/ab_fp8_d64_long.json 2>&1 | grep -v Warn | tee -a $L
echo "== fp8 d128 causal" | tee -a $L
$AB --hdim 128 --seqlens 512 1024 2048 --configs "128,128,8,3;64,64,4,3,0,1;128,64,8,3,0,1;64,128,4,3,0,1" --out $OUT/ab_fp8_d128.json 2>&1 | grep -v Warn | tee -a $L
echo "== fp8 d256 causal" | tee -a $L
$AB --hdim 256 --seqlens 512 1024 --configs "128,64,8,2;128,64,8,2,0,1;64,64,4,2,0,1;64,128,8,2,0,1" --out $OUT/ab_fp8_d256.json 2>&1 | grep -v Warn | tee -a $L
