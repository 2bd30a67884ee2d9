#!/usr/bin/env bash
# s28 call 06 (issue 29): the package's bf16 forward bench after one_loop (d64 causal short, d256 causal), and the
# forced-Triton GPU tests of the causal / softcap paths that now walk one loop.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
mkdir -p $OUT/bench
timeout 200 python3 -m flashattn2.bench --hdims 64 128 256 --dtypes bf16 --modes fwd --peers sdpa-cudnn sdpa-flash --no-memory --out-dir $OUT/bench --tag s28_h200 2>&1 | grep -v Warn | tail -n 5 | tee -a $L
FLASHATTN2_BACKEND=triton timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_attention_gpu.py -k "causal or softcap" 2>&1 | tail -n 3 | tee -a $L
