#!/usr/bin/env bash
# s29 call 06: the GPU suite's forward files under auto after the tile-table change (fwd_config now takes rows for
# every call; bf16 has no non-causal short rows, so its picks are unchanged), and the FP8 kvcache / varlen paths.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 400 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_attention_gpu.py tests/test_small_calls_gpu.py tests/test_features.py tests/test_kvcache.py 2>&1 | tail -n 3 | tee -a $L
