#!/usr/bin/env bash
# Issue 29 (after n14 / n15, on whichever tree landed): where d128 causal 512 (0.97x cuDNN on the H200 after
# session 24's P packing) and the Gluon d64 causal forward at 512 (0.72x the Triton forward that auto runs there)
# spend their time now (profile_gluon.py --case d128c / d64c: 32 x 512, 16 heads). ncu per instruction on one
# launch each; the SASS CSVs come back gzipped. Reading: stall reasons per partition (producer / consumers), the
# samples before the first S of an item (the prologue) and around the diagonal tile.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
for c in d128c d64c; do
  timeout 150 $N --set full --import-source no -k regex:attention_fwd_sm90 --launch-skip 1 --launch-count 1 \
    -o /tmp/rep_$c python3 scripts/profile_gluon.py --case $c > /tmp/ncu_$c.log 2>&1
  $N -i /tmp/rep_$c.ncu-rep --page details > $OUT/ncu_$c.txt 2>&1
  $N -i /tmp/rep_$c.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/sass_$c.csv.gz
  grep -E "Duration|Warp Cycles Per Issued|Compute \(SM\) Throughput|Stall Long|L1TEX" $OUT/ncu_$c.txt | head -n 8 | tee -a $L
done
ls -la $OUT | tee -a $L
