#!/usr/bin/env bash
# Issue 27 on the H200: the latent rows with the CUDA-graph column (kernel time without the host's), then the MLA
# backward against cuDNN in alternating rounds (ab_mla_bwd.py, the base tuning only, FlexAttention left out).
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
mkdir -p $OUT/r
timeout 260 python3 benchmarks/bench_sinks_mla.py --only latent --out-dir $OUT/r --tag h200_latent_graph \
  2>&1 | grep -v Warn | grep -E "latent|wrote|Error|error" | tee -a $L
timeout 250 python3 scripts/ab_mla_bwd.py --out $OUT/r --rounds 6 --no-flex 2>&1 | grep -v Warn | tail -n 20 | tee -a $L
