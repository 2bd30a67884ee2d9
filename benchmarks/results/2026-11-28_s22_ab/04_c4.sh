#!/usr/bin/env bash
# Session 22 call 4. Issue 27: the persistent causal grid for the MLA backward with L2-sized sections (so that the
# programs' concurrent items share fewer heads' Q/dO in L2), over today's COALESCED_DKV; ncu at 2k showed the SMs
# idle 7% of the kernel's cycles (CTA turnover and tail), which the persistent grid alone recovered 1-2.6% of.
# Issue 29: the Triton forward's d64 causal (64, 64, 4, 3) against (128, 64, 8, 3) at 2k / 4k, three runs (session
# 21's two disagreed at 2k: 0.367 and 0.401 ms against 0.389).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 300 python3 scripts/ab_mla_bwd.py --out $OUT/mla --no-flex --rounds 4 \
  --try pc:PERSISTENT_CAUSAL=1 pcs1:PERSISTENT_CAUSAL=1,L2_SECTIONS=1 pcs2:PERSISTENT_CAUSAL=1,L2_SECTIONS=2 \
  2>&1 | grep -v Warn | tee -a $L
for r in 1 2 3; do
  timeout 80 python3 scripts/sweep_configs.py --seqlen 2048 4096 --hdims 64 --modes fwd --causal yes \
    --fwd-configs "128,64,8,3;64,64,4,3;64,64,4,4" --out $OUT/sweep$r.jsonl 2>&1 | grep -v Warn | tail -n 8 | tee -a $L
done
