#!/usr/bin/env bash
# Next session (issue 27, latent): where P_APART's time went. Apply first, locally:
#   git apply benchmarks/results/2026-11-28_tried/latent_p_apart.diff
# Two ncu runs by SASS line (defaults, then P_APART=1), batch 64, 16k dense, the warm second launch; CSVs gzipped.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
for t in "base " "apart P_APART=1"; do
  set -- $t
  timeout 240 $N --import-source yes --section WarpStateStats --section SourceCounters --section SpeedOfLight \
    -k regex:latent_decode --launch-skip 1 --launch-count 1 -o $OUT/$1 --force-overwrite \
    python3 scripts/profile_gluon.py --case latent --latent-tuning "${2:-}" > $OUT/$1_run.txt 2>&1
  $N -i $OUT/$1.ncu-rep --page source --print-source sass --csv > $OUT/$1_sass.csv 2>&1
  $N -i $OUT/$1.ncu-rep --print-details all > $OUT/$1_details.txt 2>&1
  gzip -f $OUT/$1_sass.csv; rm -f $OUT/$1.ncu-rep
  grep -E "Duration|Stall (Barrier|Long)" $OUT/$1_details.txt | head -n 4
done
