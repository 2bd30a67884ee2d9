#!/usr/bin/env bash
# Latent BALANCED (benchmarks/results/2026-11-28_prepared/latent_balanced.diff, applied before this runs): the latent
# GPU tests (BALANCED=1 / 2 / 3 items of test_gluon_latent_decoding, test_gluon_latent_balanced, the schedule's
# tests on the GPU) with ConSan over BALANCED beside them, then the A/B gluon vs gluon:BALANCED=1 in both orders.
# Run with the call's timeout at 600 s: tests 230 s, the benches 170 s each.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
grep -c "BALANCED" src/flashattn2/kernels/sm90/latent.py | tee -a $L  # 0: the diff is not applied
mkdir -p build/consan
# ConSan: two parts a head slot (runs of pieces: Q reloads, phases across pieces), dense and paged; one part an SM
timeout 200 python3 scripts/consan_gluon.py latent SEESAW=1+BALANCED=2 > build/consan/dense2.log 2>&1 &
timeout 200 python3 scripts/consan_gluon.py latent paged SEESAW=1+BALANCED=2 > build/consan/paged2.log 2>&1 &
timeout 200 python3 scripts/consan_gluon.py latent SEESAW=1+BALANCED=1 > build/consan/dense1.log 2>&1 &
timeout 230 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py -k "latent or balanced" 2>&1 | tail -n 25 | tee -a $L
wait
for r in dense2 paged2 dense1; do echo "== consan $r"; grep -v Warn build/consan/$r.log | tail -n 6; done 2>&1 | tee -a $L
date -u | tee -a $L
B="gluon,gluon:BALANCED=1"
timeout 170 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 8,64 --latent-backends $B --out-dir $OUT/r --tag R1 2>&1 | grep -v Warn | grep -E "latent|wrote|Error|error" | tee -a $L
B="gluon:BALANCED=1,gluon"
timeout 170 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 8,64 --latent-backends $B --out-dir $OUT/r --tag R2 2>&1 | grep -v Warn | grep -E "latent|wrote|Error|error" | tee -a $L
date -u | tee -a $L
