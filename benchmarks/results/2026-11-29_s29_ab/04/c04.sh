#!/usr/bin/env bash
# s29 call 04 (issue 29): GPU tests of the FP8 rule as changed after call 03; then two bf16 Triton-forward A/Bs for
# cells below cuDNN: d64 non-causal 512 / 1k (Gluon 0.96x cuDNN there) with the (64, 128) tiles that won for FP8,
# and d256 causal 512 / 1k (Gluon 0.97x at 512) with 64-row tiles as for FP8 d256 causal. Predictions: d64 (64, 128)
# within 3% of (64, 64) and behind Gluon; d256 (64, 64, 4, 2) one loop 0.85-0.95 of (128, 64, 8, 2) but behind Gluon.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py tests/test_gluon.py tests/test_host.py -k "fp8 or FP8 or auto or tiles" 2>&1 | tail -n 2 | tee -a $L
AB="timeout 120 python3 scripts/ab_triton_fwd.py --rounds 5"
echo "== 1 bf16 d64 non-causal" | tee -a $L
$AB --hdim 64 --seqlens 512 1024 --configs "64,64,4,3;64,128,4,3;64,128,4,2;128,128,8,2" --out $OUT/ab1.json 2>&1 | grep -v Warn | tee -a $L
echo "== 2 bf16 d256 causal" | tee -a $L
$AB --causal --hdim 256 --seqlens 512 1024 --configs "128,64,8,2,0,1;64,64,4,2,0,1;64,32,4,3,0,1;128,32,8,3,0,1" --out $OUT/ab2.json 2>&1 | grep -v Warn | tee -a $L
