#!/usr/bin/env bash
# Session 22 call 5. Issue 29: the Triton forward's short causal d64 tiles now up to 2,048 rows (call 4: 0.365
# against 0.386 ms in three sweeps): GPU tests, then the package's d64 causal forward against cuDNN. Gluon d128 causal
# tunings at 512-2k (0.86 / 0.95x cuDNN at 512 / 1k in session 21). Issue 27: the persistent causal MLA backward
# with L2 sections, a second run (call 4: pcs2 0.968 / 1.005 / 0.986 / 1.006 of base at 2k-16k).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_attention_gpu.py -k "large_shapes or both_load_paths" 2>&1 | tail -n 4 | tee -a $L
timeout 120 python3 -m flashattn2.bench --hdims 64 --dtypes bf16 --modes fwd --causal 1 --peers sdpa-cudnn --no-memory \
  --seqlens 512 1024 2048 4096 --out-dir $OUT/bench --tag d64c 2>&1 | grep -v Warn | tail -n 12 | tee -a $L
timeout 150 python3 scripts/ab_gluon.py --out $OUT/d128c --hdims 128 --causal yes --seqlens 512 1024 2048 --rounds 2 \
  --try n64s4:BLOCK_N=64,STAGES=4 nopp:PINGPONG=0 q1:Q_STAGES=1,LAZY_O_WAIT=0 sep0:SEPARATE_O=0 s3:STAGES=3 \
  2>&1 | grep -v Warn | tail -n 4 | tee -a $L
timeout 200 python3 scripts/ab_mla_bwd.py --out $OUT/mla --no-flex --rounds 6 \
  --try pcs1:PERSISTENT_CAUSAL=1,L2_SECTIONS=1 pcs2:PERSISTENT_CAUSAL=1,L2_SECTIONS=2 2>&1 | grep "^s" | tee -a $L
