#!/usr/bin/env bash
# Session 21, call 3 (H200): issue 27, the MLA backward's 128-key x 64-row plan at two stages (v4; a helper's
# launcher and check: correctness against float64 and the package, then time against the package's kernel);
# issue 29, the d64 causal short-call tiles at 81a18f2: the GPU tests that reach them, then the forward against cuDNN.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
TRITON_ALWAYS_COMPILE=1 PYTHONPATH=src:benchmarks/results/2026-11-28_prepared/mla_bwd_64row timeout 230 python3 benchmarks/results/2026-11-28_prepared/mla_bwd_64row/run_2stage.py --out $OUT/r/mla2 2>&1 | grep -v Warn | tail -n 60 | tee -a $L
date -u | tee -a $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_attention_gpu.py -k "both_load_paths or large_shapes" 2>&1 | tail -n 4 | tee -a $L
date -u | tee -a $L
for t in D1 D2; do
  timeout 80 python3 -m flashattn2.bench --hdims 64 --dtypes bf16 --causal 1 --modes fwd --seqlens 512 1024 2048 --peers sdpa-cudnn --no-memory --out-dir $OUT/r --tag $t 2>&1 | grep -v Warn | grep -E "^\| 64" | tee -a $L
done
date -u | tee -a $L
cd $OUT && tar czf r.tgz r && rm -rf r
