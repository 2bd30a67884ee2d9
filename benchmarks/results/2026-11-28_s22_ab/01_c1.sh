#!/usr/bin/env bash
# Next session (issue 27, MLA backward): DQ_ALTERNATE, the warpgroups swapping dQ's two chunks and its one every step.
# Apply first, locally:  git apply benchmarks/results/2026-11-28_prepared/mla_dq_alternate.diff
# Why: ncu by line at 2k (session 21 call 11, results/2026-11-28_s21_ab/11_*): warpgroup 1 waits at ds_ready (for
# warpgroup 0's dS) in 26.6% of its samples, warpgroup 0 in 2.1%: warpgroup 0 does dQ chunks 0 and 1 every step,
# warpgroup 1 chunk 2. Prediction: 3-8% at 2k-8k. sm_90 (triton 3.6): 209,824 B shared (+8 KB: a second dQ slot a
# warpgroup), no C75xx, 264 HGMMA (240), spill stores 152 / 44 bytes non-causal / causal (base 128 / 68).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
grep -c "DQ_ALTERNATE" src/flashattn2/kernels/sm90/backward.py | tee -a $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py -k "unlike" 2>&1 | tail -n 5 | tee -a $L
for r in 1 2; do
  timeout 200 python3 scripts/ab_mla_bwd.py --out $OUT/ab$r --try alt:DQ_ALTERNATE=1 --rounds 6 2>&1 | grep -v Warn | tee -a $L
done
