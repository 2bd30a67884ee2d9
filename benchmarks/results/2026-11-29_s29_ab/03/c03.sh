#!/usr/bin/env bash
# s29 call 03 (issue 29, FP8 non-causal short calls on the Triton FP8 kernel): GPU tests of the new rows and auto
# rule (auto, forced Triton), the long-call A/B of the d128 / d256 non-causal FP8 main rows, the package column after
# the change, then the FP8 bench at FA3's lengths.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py tests/test_gluon.py tests/test_host.py -k "fp8 or FP8 or auto or tiles" 2>&1 | tail -n 3 | tee -a $L
FLASHATTN2_BACKEND=triton timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py 2>&1 | tail -n 3 | tee -a $L
AB="timeout 120 python3 scripts/ab_triton_fwd.py --rounds 4 --fp8"
echo "== 1 fp8 d128 non-causal long rows" | tee -a $L
$AB --hdim 128 --seqlens 2048 4096 16384 --configs "128,128,8,3;64,64,4,3;64,128,4,3" --out $OUT/ab1.json 2>&1 | grep -v Warn | tee -a $L
echo "== 2 fp8 d256 non-causal long rows" | tee -a $L
$AB --hdim 256 --seqlens 4096 16384 --configs "128,64,8,2;64,64,4,3" --out $OUT/ab2.json 2>&1 | grep -v Warn | tee -a $L
echo "== 3 package column (auto) after the change" | tee -a $L
$AB --hdim 64 --seqlens 512 1024 4096 8192 --configs "64,64,4,3;64,128,4,3" --out $OUT/ab3.json 2>&1 | grep -v Warn | tee -a $L
$AB --hdim 128 --seqlens 512 768 --configs "64,64,4,3" --out $OUT/ab4.json 2>&1 | grep -v Warn | tee -a $L
mkdir -p $OUT/bench
timeout 300 python3 benchmarks/bench_fp8.py --no-accuracy --seqlens 512 1024 2048 4096 8192 16384 --out-dir $OUT/bench --tag s29_h200 2>&1 | grep -v Warn | tail -n 45 | tee -a $L
