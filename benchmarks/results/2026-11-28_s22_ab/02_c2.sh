#!/usr/bin/env bash
# Next session (issue 29): the Gluon forward's d64 causal tunings at 512-4k, where auto runs the Triton forward
# (Gluon read 129 / 226 / 349 / 395 TFLOP/s against Triton's 207 / 289 / 349 / 387 and cuDNN's 262 / 341 / 388 / 422
# on the H200, session 21 call 2). Each variant over CONFIGS[64] + CONFIGS_CAUSAL[64]; all compile for sm_90 under
# triton 3.6 without spills or C75xx except CONSUMERS=3 without FREE_REGS (256 bytes), checked on CPU in session 21.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 280 python3 scripts/ab_gluon.py --out $OUT/d64c --hdims 64 --causal yes --seqlens 512 1024 2048 4096 --rounds 2 \
  --try pp:PINGPONG=1 pp_s2:PINGPONG=1,STAGES=2 n64:BLOCK_N=64 q1:Q_STAGES=1 three_fr:CONSUMERS=3,FREE_REGS=1 nolazy:LAZY_O_WAIT=0 \
  2>&1 | grep -v Warn | tail -n 12 | tee -a $L
timeout 150 python3 scripts/ab_gluon.py --out $OUT/d128 --hdims 128 --causal no --seqlens 512 1024 2048 --rounds 2 \
  --try n64:BLOCK_N=64,STAGES=4 q1:Q_STAGES=1 o_in:SEPARATE_O=0 nopp:PINGPONG=0 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
timeout 150 python3 scripts/ab_gluon.py --out $OUT/d256 --hdims 256 --causal no --seqlens 512 1024 2048 --rounds 2 \
  --try n32:BLOCK_N=32,STAGES=3 nopp:PINGPONG=0 2>&1 | grep -v Warn | tail -n 4 | tee -a $L
