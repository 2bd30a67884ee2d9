#!/usr/bin/env bash
# Every kernel family of scripts/sanitize.py under compute-sanitizer: memcheck, then racecheck (issue 30). Logs and
# a summary land in $OUT (default /tmp/flashattn2-sanitize). Needs a GPU and compute-sanitizer on PATH (or in
# $CUDA_HOME/bin).
#   bash scripts/sanitize.sh [family ...]        (TOOLS="memcheck" for one tool; SANITIZE_TIMEOUT per run, s)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn2-sanitize}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
SAN=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
families=("$@")
[ ${#families[@]} -eq 0 ] && families=(fwd-triton bwd-triton fwd-gluon bwd-gluon fp8 kvcache flex sinks-mla mla-gluon latent)
# compile outside the sanitizer first (and check every result): the sanitized runs then only launch
python3 scripts/sanitize.py --family "${families[@]}" 2>&1 | tee "$OUT/plain.log" | tail -n 12
[ "${PIPESTATUS[0]}" -ne 0 ] && echo "plain run failed: see $OUT/plain.log" | tee -a "$OUT/summary.txt"
status=0
for tool in ${TOOLS:-memcheck racecheck}; do
  for family in "${families[@]}"; do
    extra=()
    # every report, without host backtraces: scripts/racecheck_triage.py groups them
    [ "$tool" = racecheck ] && extra=(--racecheck-report all --print-limit 0 --show-backtrace no)
    timeout "${SANITIZE_TIMEOUT:-300}" "$SAN" --tool "$tool" "${extra[@]}" --error-exitcode 1 \
      python3 scripts/sanitize.py --family "$family" > "$OUT/$tool-$family.log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool-$family.log" | tail -n 1)
    echo "$tool $family rc=$rc ${summary:-no summary}" | tee -a "$OUT/summary.txt"
    [ $rc -ne 0 ] && status=1
  done
done
exit $status
