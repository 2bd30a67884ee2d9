#!/usr/bin/env bash
# Session 20, call 5 (H100): latent TRAIL (WG1 takes P_a and issues its P V before S_b). The latent GPU tests (the
# new trail items among them) with ConSan over TRAIL (dense, paged) beside them, then gluon against gluon:TRAIL=1 in
# three runs, both orders.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r build/consan
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
grep -c "TRAIL" src/flashattn2/kernels/sm90/latent.py | tee -a $L
timeout 200 python3 scripts/consan_gluon.py latent SEESAW=1+READY_PARTS=2+EARLY_FREE=1+TRAIL=1 > build/consan/dense.log 2>&1 &
timeout 200 python3 scripts/consan_gluon.py latent paged SEESAW=1+READY_PARTS=2+EARLY_FREE=1+TRAIL=1 > build/consan/paged.log 2>&1 &
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py -k "latent" 2>&1 | tail -n 8 | tee -a $L
wait
for r in dense paged; do echo "== consan $r"; grep -v Warn build/consan/$r.log | tail -n 4; done 2>&1 | tee -a $L
date -u | tee -a $L
for spec in "R1 gluon,gluon:TRAIL=1" "R2 gluon:TRAIL=1,gluon" "R3 gluon,gluon:TRAIL=1"; do
  set -- $spec
  timeout 120 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 8,64 --latent-backends $2 --out-dir $OUT/r --tag $1 2>&1 | grep -v Warn | grep -E "latent|Error|error" | tee -a $L
done
date -u | tee -a $L
