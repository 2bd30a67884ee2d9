#!/usr/bin/env bash
# Session 22 call 6. Issue 29: the Triton forward's d64 causal tiles at 2k / 4k, interleaved (the package bench in
# call 5 read 0.394 ms at 2k where call 4's sweeps read 0.365: bimodal or the order?); Gluon d128 causal tunings at
# 512-2k (call 5's run died on STAGES=3's shared memory). Issue 27: the MLA backward's persistent causal grid with
# one L2 section or two, a third run (calls 4-5: pcs1 0.978 / 0.983 at 2k, 0.988 / 0.982 at 8k, 1.011 / 1.025 at 16k).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 120 python3 scripts/ab_triton_fwd.py --hdim 64 --causal --seqlens 1024 2048 4096 --rounds 8 \
  --configs "128,64,8,3;64,64,4,3" --out $OUT/triton_d64c.json 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
timeout 150 python3 scripts/ab_gluon.py --out $OUT/d128c --hdims 128 --causal yes --seqlens 512 1024 2048 --rounds 2 \
  --try n64s4:BLOCK_N=64,STAGES=4 nopp:PINGPONG=0 q1:Q_STAGES=1,LAZY_O_WAIT=0 sep0:SEPARATE_O=0 \
  2>&1 | grep -v Warn | tail -n 4 | tee -a $L
timeout 200 python3 scripts/ab_mla_bwd.py --out $OUT/mla --no-flex --rounds 6 \
  --try pcs1:PERSISTENT_CAUSAL=1,L2_SECTIONS=1 pcs2:PERSISTENT_CAUSAL=1,L2_SECTIONS=2 2>&1 | grep "^s" | tee -a $L
