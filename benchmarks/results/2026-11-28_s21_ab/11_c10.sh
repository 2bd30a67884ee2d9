#!/usr/bin/env bash
# Session 21, call 11 (H200): issue 27, the MLA backward at 2k (8 x 2048, causal, 904f8ae's COALESCED_DKV), ncu
# stall samples by SASS line for the next session (where the per-item cost sits).
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
timeout 170 $N --import-source yes --section WarpStateStats --section SourceCounters --section SpeedOfLight \
  -k regex:attention_bwd --launch-skip 1 --launch-count 1 -o $OUT/mla2k --force-overwrite \
  python3 scripts/profile_gluon.py --case mla2k > $OUT/run.txt 2>&1
echo "ncu rc=$?"
$N -i $OUT/mla2k.ncu-rep --page source --print-source sass --csv > $OUT/mla2k_sass.csv 2>&1
$N -i $OUT/mla2k.ncu-rep --print-details all > $OUT/mla2k_details.txt 2>&1
gzip -f $OUT/mla2k_sass.csv; rm -f $OUT/mla2k.ncu-rep
grep -E "Duration|Stall|Registers|Warp Cycles" $OUT/mla2k_details.txt | head -n 12
