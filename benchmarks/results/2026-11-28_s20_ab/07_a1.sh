#!/usr/bin/env bash
# Session 20, call 7 (H100): latent P_APART (FlashMLA's order: P_b in its own buffer, P_a published at the pair's
# maxima, WG1's own P V first, halves loaded in the order they are freed). Tests and ConSan side by side, then
# gluon against gluon:P_APART=1 in both orders.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r build/consan
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
grep -c "P_APART" src/flashattn2/kernels/sm90/latent.py | tee -a $L
timeout 150 python3 scripts/consan_gluon.py latent SEESAW=1+READY_PARTS=2+EARLY_FREE=1+P_APART=1 > build/consan/dense.log 2>&1 &
timeout 150 python3 scripts/consan_gluon.py latent paged SEESAW=1+READY_PARTS=2+EARLY_FREE=1+P_APART=1 > build/consan/paged.log 2>&1 &
timeout 140 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py -k "latent" 2>&1 | tail -n 12 | tee -a $L
wait
for r in dense paged; do echo "== consan $r"; grep -v Warn build/consan/$r.log | tail -n 4; done 2>&1 | tee -a $L
date -u | tee -a $L
for spec in "A1 gluon,gluon:P_APART=1" "A2 gluon:P_APART=1,gluon"; do
  set -- $spec
  timeout 90 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 8,64 --latent-backends $2 --out-dir $OUT/r --tag $1 2>&1 | grep -v Warn | grep -E "latent|Error|error" | tee -a $L
done
date -u | tee -a $L
