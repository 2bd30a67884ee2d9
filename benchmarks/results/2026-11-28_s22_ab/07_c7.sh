#!/usr/bin/env bash
# Session 22 call 7. Issue 27: MLA backward calls of at most 8k causal rows now take the scheduled persistent grid
# over one L2 section (CONFIGS_MLA_SHORT_CAUSAL): GPU tests, then the A/B against the old default with cuDNN and
# FlexAttention beside. Issue 29: the Triton forward's d64 causal tiles at 2k / 4k, a second interleaved run
# (call 6: (64, 64, 4, 3) 0.971 / 0.963 of (128, 64, 8, 3)'s time).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py tests/test_gluon.py -k "unlike or scheduled_causal_grid" 2>&1 | tail -n 4 | tee -a $L
timeout 90 python3 scripts/ab_triton_fwd.py --hdim 64 --causal --seqlens 2048 4096 --rounds 10 \
  --configs "128,64,8,3;64,64,4,3" --out $OUT/triton_d64c.json 2>&1 | grep -v Warn | tail -n 3 | tee -a $L
timeout 240 python3 scripts/ab_mla_bwd.py --out $OUT/mla --rounds 4 --try old:PERSISTENT_CAUSAL=0,L2_SECTIONS=0 \
  2>&1 | grep "^s\|FAIL" | tee -a $L
