#!/usr/bin/env bash
# s27 call 3 (issue 27, latent CLUSTER): the seesaw as a cluster of two CTAs (the two 64-head halves of a query)
# sharing each key tile by TMA multicast (cluster.py's PTX rewrite; compiled here under triton 3.6: 9 boxes
# multicast, 6 peer frees, 168 registers, no spills, 222,608 B). GPU tests of the cluster rows first (a hang would
# show as the timeout), then gluon against gluon:CLUSTER=1 in both orders (batch 8 and 64; 128 heads), then the
# whole latent test set.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py -k "seesaw-cluster" 2>&1 | tail -n 15 > $OUT/t1.txt
rc=$?
cat $OUT/t1.txt | tee -a $L
date -u | tee -a $L
if grep -q " passed" $OUT/t1.txt && ! grep -q "failed\|error" $OUT/t1.txt; then
  for spec in "C1 gluon,gluon:CLUSTER=1" "C2 gluon:CLUSTER=1,gluon"; do
    set -- $spec
    timeout 110 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 8,64 --latent-backends $2 --out-dir $OUT/r --tag $1 2>&1 | grep -v Warn | grep -E "latent|Error|error" | tee -a $L
    date -u | tee -a $L
  done
  timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py -k "latent" 2>&1 | tail -n 6 | tee -a $L
fi
date -u | tee -a $L
