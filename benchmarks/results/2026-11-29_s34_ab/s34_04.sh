#!/usr/bin/env bash
# Session 34, call 04 (issue 27, MLA backward): CONFIGS_MLA with DQ_WRITER and DQ_PAIR (the landed tree). test_mla
# and test_sinks on the GPU; the A/B of the landed tuning against the last one (the consumers' reduce-adds, one
# chunk at a time) beside cuDNN, 8 rounds; the package's MLA rows against cuDNN (bench_sinks_mla.py, two runs).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 240 python3 -m pytest -q -n 16 -p no:cacheprovider tests/test_mla.py tests/test_sinks.py -rfE \
  > $OUT/tests.txt 2>&1
echo "tests rc=$?" | tee -a $L; tail -n 3 $OUT/tests.txt | cut -c1-400 | tee -a $L
timeout 300 python3 scripts/ab_mla_bwd.py --out $OUT --no-flex --rounds 8 --try last:DQ_WRITER=0,DQ_PAIR=0 \
  > $OUT/ab.txt 2>&1
echo "ab rc=$?" | tee -a $L; grep "^s[0-9]\|FAILED\|WRONG" $OUT/ab.txt | grep -v flex | cut -c1-400 | tee -a $L
mkdir -p $OUT/r
for t in h200_mla_M1 h200_mla_M2; do
  timeout 120 python3 benchmarks/bench_sinks_mla.py --only mla --out-dir $OUT/r --tag $t 2>&1 | grep -v Warn | tail -n 14 | tee -a $L
done
