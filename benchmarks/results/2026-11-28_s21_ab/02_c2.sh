#!/usr/bin/env bash
# Session 21, call 2 (H200): issue 29. (1) The Triton forward's d64 causal tiles at 512-8k (cuDNN's forward in the
# same run), the candidates that led in call 1 plus 64-row variants; (2) the forward at d64 and d128 causal forced to
# Gluon, beside the Triton forward and cuDNN (which kernel each cell should take).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
timeout 260 python3 scripts/sweep_configs.py --hdims 64 --seqlen 512 1024 2048 4096 8192 --modes fwd --causal yes --budget-s 250 \
  --fwd-configs "64,64,4,3;64,64,4,3,1;64,64,4,4;64,64,4,2;64,32,4,3;64,64,8,3;64,32,4,4;128,64,8,4" --out $OUT/r/sweep_d64.jsonl > /dev/null 2>&1
python3 - <<'PY' | tee -a $L
import json, os
rows = [json.loads(x) for x in open(os.environ["OUT"] + "/r/sweep_d64.jsonl")][1:]
for r in rows:
    print(r["hdim"], r["seqlen"], r["kind"], r["cfg"], "%.4f ms" % r["ms"] if "ms" in r else r.get("error", "")[:80], "err %.4f" % r["err"] if "err" in r else "")
PY
date -u | tee -a $L
FLASHATTN2_BACKEND=gluon timeout 200 python3 -m flashattn2.bench --hdims 64 128 --dtypes bf16 --causal 1 --modes fwd --seqlens 512 1024 2048 4096 8192 \
  --peers sdpa-cudnn flashattn2-triton --no-memory --out-dir $OUT/r --tag gluon_vs_triton 2>&1 | grep -v Warn | tail -n 30 | tee -a $L
date -u | tee -a $L
cd $OUT && tar czf r.tgz r && rm -rf r
