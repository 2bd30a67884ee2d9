#!/usr/bin/env bash
# Session 32 call 02: descriptors encoded once per address (launch._Encoded). Tests first (the new GPU test, then the
# whole suite forced to Gluon: every Gluon launch takes the new path), then host time base (HEAD's src in
# .calls/base) against this tree, alternating, latent and short forward calls.
set -uo pipefail
export PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
PYTHONPATH=$PWD/src timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gluon.py -k "encoded_descriptors" -rfE 2>&1 | tail -n 4 | tee -a $L
FLASHATTN2_BACKEND=gluon PYTHONPATH=$PWD/src timeout 300 python3 -m pytest -q -n 16 -p no:cacheprovider tests --ignore=tests/test_long_rows.py -rfE > $OUT/suite_gluon.txt 2>&1
echo "suite forced to gluon rc=$?" | tee -a $L; tail -n 3 $OUT/suite_gluon.txt | tee -a $L
mkdir -p $OUT/host
for r in 1 2; do
  for t in base new; do
    src=$PWD/src; [ $t = base ] && src=$PWD/.calls/base/src
    PYTHONPATH=$src:$PWD/scripts timeout 90 python3 scripts/host_vs_gpu.py --latent --out $OUT/host/latent_${t}_$r.json 2>&1 | grep -v Warn | sed "s/^/$t $r /" | tee -a $L
    [ $r = 1 ] && PYTHONPATH=$src:$PWD/scripts timeout 90 python3 scripts/host_vs_gpu.py --out $OUT/host/fwd_${t}_$r.json 2>&1 | grep -v Warn | sed "s/^/$t $r /" | tee -a $L
  done
done
