#!/usr/bin/env bash
# Session 20, call 6 (H100): the latent seesaw's memory-side sections (L2 and DRAM throughput, L2 hit rate, the
# L2 -> SM traffic), defaults, batch 64, 16k dense, warm second launch.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
timeout 150 $N --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  --section MemoryWorkloadAnalysis_Chart \
  --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum.per_second \
  -k regex:latent_decode --launch-skip 1 --launch-count 1 --print-details all \
  python3 scripts/profile_gluon.py --case latent > $OUT/ncu_mem.txt 2>&1
echo "rc=$?"
grep -E "Throughput|Hit Rate|bytes|Bandwidth|lts__|dram__|l1tex__m|Duration|Busy|Peak" $OUT/ncu_mem.txt | cut -c1-150 | head -n 60
