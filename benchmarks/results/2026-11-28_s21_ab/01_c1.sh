#!/usr/bin/env bash
# Session 21, call 1 (H200): issue 27 latent FULL_TILES (tiles inside the range skip the key mask and -inf guard):
# the seesaw's GPU tests and ConSan over it, then gluon against gluon:FULL_TILES=1 in both orders; the MLA rows
# against cuDNN at HEAD (H200 baseline); issue 29: the Triton forward's d64 causal tiles at 512-2k and d128 causal
# at 512-1k (with cuDNN's forward in the same run).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/r build/consan
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
date -u | tee -a $L
timeout 200 python3 scripts/consan_gluon.py latent SEESAW=1+READY_PARTS=2+EARLY_FREE=1+FULL_TILES=1 > build/consan/dense.log 2>&1 &
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_mla.py -k "latent" 2>&1 | tail -n 8 | tee -a $L
wait
echo "== consan dense"; grep -v Warn build/consan/dense.log | tail -n 4 | tee -a $L
cp build/consan/dense.log $OUT/r/consan_dense.log
date -u | tee -a $L
for spec in "F1 gluon,gluon:FULL_TILES=1" "F2 gluon:FULL_TILES=1,gluon"; do
  set -- $spec
  timeout 120 python3 benchmarks/bench_sinks_mla.py --only latent --latent-batches 8,64 --latent-backends $2 --out-dir $OUT/r --tag $1 2>&1 | grep -v Warn | grep -E "latent|Error|error" | tee -a $L
done
date -u | tee -a $L
timeout 150 python3 benchmarks/bench_sinks_mla.py --only mla --out-dir $OUT/r --tag M1 2>&1 | grep -v Warn | tail -n 14 | tee -a $L
date -u | tee -a $L
timeout 130 python3 scripts/sweep_configs.py --hdims 64 --seqlen 512 1024 2048 --modes fwd --causal yes --extra --budget-s 120 --out $OUT/r/sweep_d64.jsonl > /dev/null 2>&1
timeout 60 python3 scripts/sweep_configs.py --hdims 128 --seqlen 512 1024 --modes fwd --causal yes --extra --budget-s 50 --out $OUT/r/sweep_d128.jsonl > /dev/null 2>&1
python3 - <<'PY' | tee -a $L
import json, glob, os
for f in sorted(glob.glob(os.environ["OUT"] + "/r/sweep_*.jsonl")):
    rows = [json.loads(x) for x in open(f)][1:]
    for r in rows:
        print(r["hdim"], r["seqlen"], r["kind"], r["cfg"], "%.3f ms" % r["ms"] if "ms" in r else r.get("error", "")[:80], "err %.4f" % r["err"] if "err" in r else "")
PY
date -u | tee -a $L
cd $OUT && tar czf r.tgz r && rm -rf r
