#!/usr/bin/env bash
# Session 33, call 02 (issue 29): DEFER_O, each consumer's item output stored while the next item's first S is in
# flight (sm_90 SASS: STG/STSM/UTMASTG between the first HGMMA and its WARPGROUP.DEPBAR). Prediction: +3-6% at d64
# non-causal 512 / 1k, +2-4% d128 512 / 1k, within 1% from 4k (the epilogue's share of an item).
# 1) the GPU tests of DEFER_O against float64 (both grids, packed, FP8); 2) the A/B against the defaults, cuDNN and
# Triton in one process, three alternating rounds; 3) the kept-descriptor host A/B (session 32's n73) if time is left.
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
S=$(date +%s)
timeout 170 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_gluon.py -k "defer" -rfE 2>&1 | tail -n 4 | tee -a $L
echo "tests $(( $(date +%s) - S )) s" | tee -a $L
mkdir -p $OUT/nc64 $OUT/d128 $OUT/c64
timeout 130 python3 scripts/ab_gluon.py --out $OUT/nc64 --hdims 64 --causal no --seqlens 512 1024 2048 4096 --rounds 3 \
  --try defer:DEFER_O=1 2>&1 | grep -v Warn | tee -a $L
echo "nc64 $(( $(date +%s) - S )) s" | tee -a $L
timeout 150 python3 scripts/ab_gluon.py --out $OUT/d128 --hdims 128 --causal both --seqlens 512 1024 4096 16384 --rounds 3 \
  --try defer:DEFER_O=1 2>&1 | grep -v Warn | tee -a $L
echo "d128 $(( $(date +%s) - S )) s" | tee -a $L
timeout 90 python3 scripts/ab_gluon.py --out $OUT/c64 --hdims 64 --causal yes --seqlens 1024 4096 --rounds 3 \
  --try defer:DEFER_O=1 2>&1 | grep -v Warn | tee -a $L
echo "c64 $(( $(date +%s) - S )) s" | tee -a $L
R=$(( 575 - ($(date +%s) - S) ))
[ $R -gt 40 ] && timeout $R python3 scripts/host_vs_gpu.py --kept-ab --out $OUT/kept_ab.json 2>&1 | grep -v Warn | tail -n 30 | tee -a $L
echo "end $(( $(date +%s) - S )) s" | tee -a $L
