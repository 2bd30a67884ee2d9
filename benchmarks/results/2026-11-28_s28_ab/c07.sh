#!/usr/bin/env bash
# s28 call 07 (issue 29, FP8): FwdConfig.v_keys_last=False, the Triton FP8 forward reading V as it comes (no per-call
# keys-last copy, 21-25 us; the compiler then loads V through registers and stores it transposed: sm_90, d128 (64,
# 64, 4, 3): 12 fewer LDGSTS, 64 more STS, 48 more PRMT, 40 KB of shared memory against 57). Prediction: faster where
# the copy is a large share (512 rows: +10-15%), slower from 2k. GPU tests, then A/Bs at FP8 causal short rows.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 70 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py -k "v_as_it_comes" 2>&1 | tail -n 2 | tee -a $L
AB="timeout 60 python3 scripts/ab_triton_fwd.py --causal --fp8 --rounds 4"
$AB --hdim 64 --seqlens 512 1024 2048 --configs "64,64,4,3,0,1;64,64,4,3,0,1,0" --out $OUT/ab_d64.json 2>&1 | grep -v Warn | tee -a $L
$AB --hdim 128 --seqlens 512 1024 --configs "64,64,4,3,0,1;64,64,4,3,0,1,0" --out $OUT/ab_d128.json 2>&1 | grep -v Warn | tee -a $L
$AB --hdim 256 --seqlens 512 1024 --configs "64,64,4,2,0,1;64,64,4,2,0,1,0" --out $OUT/ab_d256.json 2>&1 | grep -v Warn | tee -a $L
