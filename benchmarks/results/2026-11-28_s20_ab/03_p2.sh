#!/usr/bin/env bash
# Session 20, call 3 (H100): issue 27. (1) ncu stall samples by SASS line on the latent seesaw at the defaults
# (batch 64, 16k dense, 128 heads, warm second launch); (2) the MLA rows against cuDNN at HEAD, two runs.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r
L=$OUT/log.txt
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 240 $N --import-source yes --section WarpStateStats --section SourceCounters --section SpeedOfLight \
  -k regex:latent_decode --launch-skip 1 --launch-count 1 -o $OUT/lat --force-overwrite \
  python3 scripts/profile_gluon.py --case latent > $OUT/ncu_run.txt 2>&1
echo "ncu rc=$?" | tee -a $L
tail -n 5 $OUT/ncu_run.txt | tee -a $L
$N -i $OUT/lat.ncu-rep --page source --print-source sass --csv > $OUT/ncu_sass.csv 2>&1
echo "sass csv rc=$? lines $(wc -l < $OUT/ncu_sass.csv)" | tee -a $L
$N -i $OUT/lat.ncu-rep --print-details all > $OUT/ncu_details.txt 2>&1
gzip -f $OUT/ncu_sass.csv
rm -f $OUT/lat.ncu-rep
for t in M1 M2; do
  timeout 150 python3 benchmarks/bench_sinks_mla.py --only mla --out-dir $OUT/r --tag $t 2>&1 | grep -v Warn | tail -n 14 | tee -a $L
done
date -u | tee -a $L
