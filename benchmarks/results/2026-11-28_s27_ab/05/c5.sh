#!/usr/bin/env bash
# s27 call 5 (issue 29, d64 causal 512-4k on the Triton forward, 0.90 / 0.93x cuDNN at 512 / 1k): FwdConfig.walk,
# a 1-D grid walking the last (longest) query tile first over L2 sections of heads (device/tile_order.py, as the
# Gluon forward's sectioned grid), on in _HOPPER_FWD_SHORT_CAUSAL in this tree. GPU tests of the forward paths it
# touches (auto: d64 causal <= 4k runs it), then ab_triton_fwd: walk 0 (launch order) against 1, 2, 4 (sections of
# 1, 1/2, 1/4 of L2), cuDNN and the package call beside, 6 alternating rounds.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 280 python3 -m pytest -q -n 14 -p no:cacheprovider tests/test_attention_gpu.py tests/test_features.py \
  tests/test_small_calls_gpu.py tests/test_sinks.py -x 2>&1 | tail -n 4 | tee -a $L
timeout 250 python3 scripts/ab_triton_fwd.py --hdim 64 --causal --seqlens 512 1024 2048 4096 --rounds 6 \
  --configs "64,64,4,3;64,64,4,3,0,1;64,64,4,3,0,2;64,64,4,3,0,4" --out $OUT/ab_walk.json 2>&1 | grep -v Warn | tee -a $L
