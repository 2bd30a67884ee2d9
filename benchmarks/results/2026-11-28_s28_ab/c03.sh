#!/usr/bin/env bash
# s28 call 03 (issue 29): one_loop now on the FP8 d64 causal and the d256 causal rows too: their GPU tests; then
# the d64 causal 512 / 768 tiles again with one loop each (the pipeline now fills once, so other tiles may win), and
# the FP8 d64 causal tiles with one loop.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py tests/test_attention_gpu.py -k "fp8 or features_large or one_key_loop" 2>&1 | tail -n 3 | tee -a $L
FLASHATTN2_BACKEND=triton timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_attention_gpu.py -k "large_shapes and 256" 2>&1 | tail -n 3 | tee -a $L
AB="timeout 150 python3 scripts/ab_triton_fwd.py --causal --rounds 5"
echo "== d64 tiles, one loop" | tee -a $L
$AB --hdim 64 --seqlens 512 768 --configs "64,64,4,3,0,1;64,128,4,2,0,1;128,64,8,3,0,1;128,128,8,2,0,1;64,64,4,4,0,1;64,32,4,4,0,1" --out $OUT/ab_d64_tiles.json 2>&1 | grep -v Warn | tee -a $L
echo "== fp8 d64 tiles, one loop" | tee -a $L
$AB --fp8 --hdim 64 --seqlens 512 1024 --configs "128,128,8,3,0,1;64,128,4,3,0,1;128,64,8,3,0,1;64,64,4,3,0,1" --out $OUT/ab_fp8_d64_tiles.json 2>&1 | grep -v Warn | tee -a $L
