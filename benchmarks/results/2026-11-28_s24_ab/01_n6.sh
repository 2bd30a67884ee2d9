#!/usr/bin/env bash
# Issues 29 and 27 (prepared in session 23, not yet run on a GPU): three instruction cuts, compile-checked on sm_90
# (triton 3.6), measured against the tree before them. Locally first:
#   rm -rf .calls/base && mkdir -p .calls/base && git archive HEAD src | tar -x -C .calls/base
#   P=benchmarks/results/2026-11-28_prepared
#   git apply $P/fwd_half2.diff $P/bwd_mask_rel.diff $P/fwd_reverse_n.diff $P/fwd_out_reciprocal.diff \
#     $P/fwd_q_early.diff
# fwd_out_reciprocal: finalize's output as acc * (1 / l) (a reciprocal a row) instead of acc / l (a division a
#   value, three instructions each in SASS): d128 causal Gluon forward 5,792 -> 5,416 instructions, FSEL 412 -> 288,
#   spills unchanged; shared by the Triton forward, the KV-cache and flex kernels (CPU interpreter tests pass).
#   Runs once an item: about 8% of a consumer's instructions an item at 512, nothing at 16k.
# (fwd_reverse_n and fwd_q_early add the tuning keys REVERSE_N and Q_EARLY, both off: this call's tree A/B does not
# see them; n7.sh measures them.)
# fwd_half2: the Gluon forward's P to bf16/fp16 by cvt.rn.*x2 (inline asm, two elements a conversion); ptxas packed
#   the scalar conversions' pairs the wrong way round and swapped every register back: PRMT 320 -> 0 at d128 causal
#   (5,952 -> 5,792 instructions), 384 -> 0 at d64 non-causal, no spill changes. Prediction: forward +1-4% where the
#   softmax's issue bounds it (d64, d128 512-2k), level elsewhere. If the GPU test fails with every P pair swapped,
#   the asm's $1/$2 are the other way round.
# bwd_mask_rel: the Gluon backward's keys x queries mask as per-key thresholds on the query (one compare a score an
#   edge): d128 causal 6,288 -> 5,984 instructions (spills 44 -> 40 B), MLA 6,264 -> 6,128 (68 -> 72 B, two more
#   LDL in the consumers' loops), d64 causal 7,928 -> 7,192 (24 -> 60 B; in-loop spill instructions 8 -> 28: the
#   risk). Prediction: d128 bwd causal +1-3%, MLA bwd +0-2%, d64 either way; if d64 loses, look at its spills first.
# At most 8 files come back: each A/B keeps its summary and one new-tree run (a result set); the rest stays in /tmp.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
grep -c "to_half2\|2147483647" src/flashattn2/kernels/sm90/forward.py src/flashattn2/kernels/device/mask.py | tee -a $L
timeout 280 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_gluon.py tests/test_mla.py \
  -k "(stress or unlike or backward or varlen or key_tiles_last or q_early) and not compiles" 2>&1 | tail -n 3 | tee -a $L
timeout 150 python3 scripts/ab_trees.py --base .calls/base/src --new src --rounds 3 --out $OUT/fwd -- \
  --hdims 64 128 256 --modes fwd --causal both --seqlens 512 2048 8192 2>&1 | grep -v Warn | tee -a $L
rm -f $OUT/fwd/base*.json $OUT/fwd/new0.json $OUT/fwd/new1.json
