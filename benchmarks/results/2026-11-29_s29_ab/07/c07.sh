#!/usr/bin/env bash
# s29 call 07: the FP8 non-causal main rows of the Triton FP8 forward moved (d128 (64, 128, 4, 3), d256 (64, 64, 4, 3);
# what packed batches and forced calls run): test_fp8 forced to Triton and under auto.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
FLASHATTN2_BACKEND=triton timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py 2>&1 | tail -n 2 | tee -a $L
timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fp8.py 2>&1 | tail -n 2 | tee -a $L
