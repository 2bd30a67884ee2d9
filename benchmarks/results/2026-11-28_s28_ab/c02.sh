#!/usr/bin/env bash
# s28 call 02 (issue 29): one_loop on in _HOPPER_FWD_SHORT_CAUSAL (d64 causal <= 4k rows). GPU tests under auto and
# forced Triton, then one_loop A/Bs on the other Triton forward rows auto still runs: FP8 d64 causal < 2k,
# softcap d128 / d256 causal, long d64 causal (128, 64, 8, 3).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_attention_gpu.py tests/test_small_calls_gpu.py tests/test_fp8.py 2>&1 | tail -n 3 | tee -a $L
FLASHATTN2_BACKEND=triton timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_attention_gpu.py -k "causal" 2>&1 | tail -n 3 | tee -a $L
AB="timeout 120 python3 scripts/ab_triton_fwd.py --causal --rounds 5"
echo "== fp8 d64" | tee -a $L
$AB --fp8 --hdim 64 --seqlens 512 1024 --configs "128,128,8,3;128,128,8,3,0,1" --out $OUT/ab_fp8_d64.json 2>&1 | grep -v Warn | tee -a $L
echo "== softcap d128" | tee -a $L
$AB --softcap 30 --hdim 128 --seqlens 512 2048 --configs "64,64,4,3;64,64,4,3,0,1" --out $OUT/ab_sc_d128.json 2>&1 | grep -v Warn | tee -a $L
echo "== softcap d256" | tee -a $L
$AB --softcap 30 --hdim 256 --seqlens 512 2048 --configs "128,64,8,2;128,64,8,2,0,1" --out $OUT/ab_sc_d256.json 2>&1 | grep -v Warn | tee -a $L
echo "== d64 long" | tee -a $L
$AB --hdim 64 --seqlens 8192 --configs "128,64,8,3;128,64,8,3,0,1" --out $OUT/ab_d64_long.json 2>&1 | grep -v Warn | tee -a $L
