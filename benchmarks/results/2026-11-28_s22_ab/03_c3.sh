#!/usr/bin/env bash
# Session 22 call 3. Issue 29: PINGPONG=0 at d256 (call 2: non-causal +1 / +4 / +3% at 512 / 1k / 2k), both causal
# settings over 512-16k, three alternating rounds. Issue 27: FlexAttention's MLA backward beside cuDNN at 4k-16k
# (call 1 got it at 2k only: torch's donated buffers refused retain_graph; the script now turns them off).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 330 python3 scripts/ab_gluon.py --out $OUT/d256 --hdims 256 --causal both --seqlens 512 1024 2048 4096 8192 16384 \
  --rounds 3 --try nopp:PINGPONG=0 2>&1 | grep -v Warn | tail -n 12 | tee -a $L
timeout 200 python3 scripts/ab_mla_bwd.py --out $OUT/mla --seqlens 2048 4096 8192 16384 --rounds 2 2>&1 | grep -v Warn | tee -a $L
