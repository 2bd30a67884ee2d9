#!/usr/bin/env bash
# Issue 29 (session 23, call 2): ITEM_AHEAD (each partition loads its next item's schedule entry one item early),
# tests then A/B on the scheduled causal grid; then ncu's per-instruction stall samples of d128 causal 512.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_gluon.py -k "item_ahead or forward_stress" 2>&1 | tail -n 5 | tee -a $L
timeout 200 python3 scripts/ab_gluon.py --out $OUT/d128 --hdims 128 --causal yes --seqlens 512 1024 2048 4096 --rounds 4 \
  --try ah:ITEM_AHEAD=1 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
timeout 100 python3 scripts/ab_gluon.py --out $OUT/d64 --hdims 64 --causal yes --seqlens 512 1024 2048 --rounds 4 \
  --try ah:ITEM_AHEAD=1 2>&1 | grep -v Warn | tail -n 3 | tee -a $L
timeout 120 python3 scripts/ab_mla_fwd.py ah:ITEM_AHEAD=True 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
for name in default ahead; do
  t=""; [ $name = ahead ] && t="ITEM_AHEAD=1"
  timeout 120 $N --set full --import-source no -k regex:attention_fwd_sm90 --launch-skip 1 --launch-count 1 \
    -o /tmp/rep_$name python3 scripts/profile_gluon.py --case d128c --fwd-tuning "$t" > /tmp/ncu_$name.log 2>&1
  $N -i /tmp/rep_$name.ncu-rep --page details > $OUT/ncu_d128c_$name.txt 2>&1
  $N -i /tmp/rep_$name.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/sass_d128c_$name.csv.gz
  grep -E "Duration|Warp Cycles Per Issued|Compute \(SM\) Throughput|Stall Long|L1TEX" $OUT/ncu_d128c_$name.txt | head -n 8 | tee -a $L
done
ls -la $OUT | tee -a $L
