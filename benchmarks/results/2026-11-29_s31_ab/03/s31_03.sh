#!/usr/bin/env bash
# Issue 27 on an H200 (session 31): n62_h100_issue27.sh with H200 tags; the latent figure is a reading only (tensor-bound there).
# twentieth session. GPU tests of the MLA, latent and sink paths first; then the three figures the issue asks for,
# as session 20 measured them (results/2026-11-28_s20_h200_*): latent-cache decoding against the copy bandwidth
# (batches 8 and 64, dense and paged), the sink's cost (9 interleaved rounds), MLA 192/128 forward and backward
# against cuDNN (two runs). Predictions, from session 20's H100 run and the H200 runs since: latent 0.68-0.85 of the
# copy at batch 64; sink cost <= 2.5%; MLA forward 0.97-1.17x, backward 0.92-1.05x cuDNN.
# Copy to .calls/ and run from the repository root: bash .calls/n62_h200_issue27.sh
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py tests/test_sinks.py 2>&1 | tail -n 2 | tee -a $L
mkdir -p $OUT/r
timeout 150 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 8,64 --out-dir $OUT/r --tag h200_latent \
  2>&1 | grep -v Warn | grep -E "latent|wrote|Error|error" | tee -a $L
timeout 150 python3 benchmarks/bench_sinks_mla.py --only sink --sink-rounds 9 --out-dir $OUT/r --tag h200_sink_cost \
  2>&1 | grep -v Warn | grep -iE "sink|wrote|error" | tee -a $L
for t in h200_mla_M1 h200_mla_M2; do
  timeout 120 python3 benchmarks/bench_sinks_mla.py --only mla --out-dir $OUT/r --tag $t 2>&1 | grep -v Warn | tail -n 14 | tee -a $L
done
