#!/usr/bin/env bash
# Issue 29 (prepared in session 22, not yet run on a GPU): ITEM_OVERLAP, the Gluon forward's consumers starting a
# work item's first S beside the last item's last PV (the item's output after it), so that short items stop
# paying their first S and last PV alone. Apply first, locally:
#   git apply benchmarks/results/2026-11-28_prepared/item_overlap.diff
# sm_90 (triton 3.6): d128 causal / non-causal / d64 causal / FP8 d128 compile with no C75xx, shared memory as
# today, HGMMA 96 -> 144 (the chained path is a second copy of the loop), spill stores 76 / 92 / 56 / 40 bytes,
# all scalar (item metadata) at item boundaries, none in the key-tile loop; the default path's SASS is unchanged
# in length and opcode counts (a few registers renumbered); the spills lie outside the key-tile loops (checked on
# the SASS's innermost HGMMA loops). Also compiled: varlen d128 causal 4 B, MLA 192/128 causal 12 B, d64 causal fp16
# with softcap 68 B, and three consumers (d64 non-causal's default) 256 B, so expect a loss there. Prediction: d128 causal +3-8% at 512-1k, +1-3% at 2k,
# level from 4k; non-causal 512 +2-5%.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
grep -c "ITEM_OVERLAP" src/flashattn2/kernels/sm90/forward.py | tee -a $L
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_gluon.py -k "items_chained or forward_stress or item_overlap" 2>&1 | tail -n 5 | tee -a $L
timeout 200 python3 scripts/ab_gluon.py --out $OUT/d128 --hdims 128 --causal both --seqlens 512 1024 2048 4096 --rounds 3 \
  --try ov:ITEM_OVERLAP=1 2>&1 | grep -v Warn | tail -n 8 | tee -a $L
timeout 120 python3 scripts/ab_gluon.py --out $OUT/d64 --hdims 64 --causal both --seqlens 512 1024 2048 --rounds 3 \
  --try ov:ITEM_OVERLAP=1 2>&1 | grep -v Warn | tail -n 6 | tee -a $L
# issue 27's MLA forward (192/128 causal; 0.92x cuDNN at 2k on the H100, session 20): the same chaining
timeout 150 python3 scripts/ab_mla_fwd.py ov:ITEM_OVERLAP=True 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
# ncu of the d128 causal forward at 512, default and chained (SpeedOfLight and warp states; the second launch)
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
for name in default chained; do
  t=""; [ $name = chained ] && t="ITEM_OVERLAP=1"
  timeout 60 $N --section WarpStateStats --section SpeedOfLight -k regex:attention_fwd_sm90 --launch-skip 1 \
    --launch-count 1 python3 scripts/profile_gluon.py --case d128c --fwd-tuning "$t" > $OUT/ncu_d128c_$name.txt 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Compute \(SM\) Throughput" $OUT/ncu_d128c_$name.txt | head -n 6 | tee -a $L
done
