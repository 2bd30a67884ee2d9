#!/usr/bin/env bash
# Session 21, call 5 (H200): issue 27, where the MLA backward's time goes around its main kernel (call 3: the kernel
# alone 1.118 ms, the whole backward 1.302 at 2k; 6.865 against 7.425 at 16k): kernels by CUDA time, ours and cuDNN's.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 200 python3 scripts/profile_bwd_kernels.py --peer --shapes mla:8x2048 mla:1x16384 d128:4x4096 d128:1x16384 2>&1 | grep -v Warn | tee -a $L
