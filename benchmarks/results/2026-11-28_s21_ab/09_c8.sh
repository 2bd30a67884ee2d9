#!/usr/bin/env bash
# Session 21, call 9 (H200): issue 27, CONFIGS_MLA with COALESCED_DKV: the MLA GPU tests (both dK/dV store paths),
# then the MLA rows against cuDNN, two runs.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
grep -n "COALESCED_DKV=True" src/flashattn2/kernels/sm90/backward.py | tee -a $L
date -u | tee -a $L
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py -k "unlike or mla" 2>&1 | tail -n 6 | tee -a $L
date -u | tee -a $L
for t in M2 M3; do
  timeout 120 python3 benchmarks/bench_sinks_mla.py --only mla --out-dir $OUT/r --tag $t 2>&1 | grep -v Warn | grep -E "mla " | tee -a $L
done
date -u | tee -a $L
cd $OUT && tar czf r.tgz r && rm -rf r
