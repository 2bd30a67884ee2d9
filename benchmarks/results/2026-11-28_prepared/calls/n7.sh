#!/usr/bin/env bash
# Issues 29 and 27 (prepared in session 23): REVERSE_N, each item's key tiles last to first (FlashAttention-3's
# order), on the tree n6.sh ran (all three prepared diffs applied), interleaved against the default by tuning key;
# then the MLA backward from each tree (bwd_mask_rel). REVERSE_N puts the causal diagonal's tile first, the tile
# that is masked anyway, so the tiles after it are whole: per item one masked tile fewer wherever items hold more
# than one key tile. sm_90 (triton 3.6): executed per item, a masked step (723 instructions at d128 causal)
# becomes an unmasked one (477); static code 5,792 -> 6,584 (the right-edge loop, run zero times at causal 128 x
# 128, grew); no spills at d128 / d64; FP8 d128 causal 216 B of spills -> 0; MLA 12 -> 52 B. Prediction: d128
# causal +4-7% at 512, +2-4% at 1-2k, level from 4k; d64 causal alike; FP8 d128 causal +2-6%; non-causal level.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 170 python3 scripts/ab_gluon.py --out $OUT/bf16 --hdims 64 128 --causal both --seqlens 512 1024 2048 4096 \
  --rounds 3 --try rn:REVERSE_N=1 2>&1 | grep -v Warn | tail -n 16 | tee -a $L
timeout 90 python3 scripts/ab_gluon.py --out $OUT/fp8 --dtypes fp8 --hdims 128 --causal yes --seqlens 512 2048 8192 \
  --rounds 3 --try rn:REVERSE_N=1 2>&1 | grep -v Warn | tail -n 3 | tee -a $L
timeout 90 python3 scripts/ab_mla_fwd.py rn:REVERSE_N=True 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
for t in base new base new; do
  tree=src; [ $t = base ] && tree=.calls/base/src
  echo "== MLA bwd $t" | tee -a $L
  PYTHONPATH=$tree timeout 60 python3 scripts/ab_mla_bwd.py --out /tmp/mla_$t --rounds 2 --no-flex --seqlens 2048 8192 \
    2>&1 | grep -v Warn | tail -n 2 | tee -a $L
done
