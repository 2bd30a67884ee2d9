#!/usr/bin/env bash
# Issue 27, latent multicast, steps 1-2 of results/2026-11-28_prepared/latent_multicast/README.md's verdict (any
# sm_90 card: the launch and the cluster occupancy do not depend on H100 or H200). About 60 s.
# 1. A kernel whose cluster shape is only in its PTX launches as clusters of 2 through Triton's launcher, K boxes
#    multicast, the marked arrive on the peer (the tiny kernel: two equal copies of the source, 200 launches).
# 2. cuOccupancyMaxActiveClusters for the seesaw built as a cluster (its threads, registers, 222 KB): batch 64 at
#    128 heads needs 64 pairs in one wave.
# Go on to the A/B (the seesaw with doubled empty counts, the hello barrier, peer frees) only if 1 passes and 2
# reads at least 64.
# Copy to .calls/ and run from the repository root: bash .calls/n30.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_ALWAYS_COMPILE=1
export PYTHONPATH=src:benchmarks/results/2026-11-28_prepared/latent_multicast
timeout 150 python3 benchmarks/results/2026-11-28_s26_prepared/probe_cluster_run.py 2>&1 | grep -v Warn \
  | tee $OUT/log.txt
echo "exit ${PIPESTATUS[0]}" | tee -a $OUT/log.txt
