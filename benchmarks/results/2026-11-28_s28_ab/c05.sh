#!/usr/bin/env bash
# s28 call 05 (issue 29, FP8): FP8 causal short calls on the Triton kernel's 64-row tiles as one loop (d64 to 16k,
# d128 / d256 under 1k rows under auto). GPU tests under auto and forced Triton, the d64 16k crossover, then the
# FP8 bench (FA3's lengths, all head dims).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py tests/test_gluon.py -k "fp8 or FP8 or auto" 2>&1 | tail -n 3 | tee -a $L
FLASHATTN2_BACKEND=triton timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py 2>&1 | tail -n 3 | tee -a $L
echo "== fp8 d64 causal 16k" | tee -a $L
timeout 100 python3 scripts/ab_triton_fwd.py --causal --fp8 --rounds 5 --hdim 64 --seqlens 16384 --configs "64,128,4,3,0,1;64,64,4,3,0,1" --out $OUT/ab_fp8_d64_16k.json 2>&1 | grep -v Warn | tee -a $L
mkdir -p $OUT/bench
timeout 300 python3 benchmarks/bench_fp8.py --no-accuracy --seqlens 512 1024 2048 4096 8192 16384 --out-dir $OUT/bench --tag s28_h200 2>&1 | grep -v Warn | tail -n 45 | tee -a $L
