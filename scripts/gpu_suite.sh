#!/usr/bin/env bash
# Everything the GPU has to confirm, in one go: the whole test suite on compiled kernels (the
# interpreter never shows races or bounds errors), then the benchmark. Results land in $OUT.
#   bash scripts/gpu_suite.sh [--no-bench] [extra args for python -m flashattn2.bench]
# then python benchmarks/bench_features.py (the training features' costs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn2-gpu}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
# $OUT comes back with at most 8 files: two logs and the two result sets (json, md, png each)
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' \
  | tee "$OUT/tests.log"
# test_long_rows allocates 4 GiB tensors: beside other workers it can run out of memory, so it runs alone
python3 -m pytest -q -n 8 -p no:cacheprovider tests --ignore=tests/test_long_rows.py 2>&1 | tee -a "$OUT/tests.log" | tail -n 25
status=${PIPESTATUS[0]}
python3 -m pytest -q -p no:cacheprovider tests/test_long_rows.py 2>&1 | tee -a "$OUT/tests.log" | tail -n 5
[ "${PIPESTATUS[0]}" -ne 0 ] && status=1
if [ "${1:-}" != "--no-bench" ]; then
  python3 -m flashattn2.bench --out-dir "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -n 60
  ls "$OUT"/*.json | grep -v _features | xargs python3 benchmarks/report_bench.py 2>&1 | tee -a "$OUT/bench.log"
  python3 benchmarks/bench_features.py --out-dir "$OUT" 2>&1 | tee -a "$OUT/bench.log" | tail -n 20
  python3 benchmarks/plot_bench.py "$OUT"/*.json 2>&1 | tee -a "$OUT/bench.log"
fi
exit "$status"
