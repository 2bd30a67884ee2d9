#!/usr/bin/env bash
# Issue 12's benchmark rows on nvidia-h200-x2 (NVLink multicast off, KINDS.md), one part a call (each under the
# 10-minute limit; the bench writes its JSON only at its end). Copy to .calls/ and run from the repository root:
#   bash .calls/cp_rows.sh A     64k and 128k, 16 and 32 heads, causal and not       (~2 min with the start)
#   bash .calls/cp_rows.sh B     256k, the same four                                 (~4 min)
#   bash .calls/cp_rows.sh C     512k causal, 16 and 32 heads                        (~5 min)
#   bash .calls/cp_rows.sh D16   512k non-causal, 16 heads                           (~4 min)
#   bash .calls/cp_rows.sh D32   512k non-causal, 32 heads                           (~7 min)
# Estimates scale session 34's row (128k causal 16 heads: one GPU 448 ms a forward + backward, the ring about
# half) by the square of the length, twice for non-causal and for 32 heads, 5 steps a measurement. Each part
# includes PyTorch's context_parallel peer. Merge the JSONs' rows for the report (report_context_parallel.py).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
part=${1:?part A, B, C, D16 or D32}
case $part in
  A) rows=(--seqlens 65536 131072 --nheads 16 32 --causal 0 1) ;;
  B) rows=(--seqlens 262144 --nheads 16 32 --causal 0 1) ;;
  C) rows=(--seqlens 524288 --nheads 16 32 --causal 1) ;;
  D16) rows=(--seqlens 524288 --nheads 16 --causal 0) ;;
  D32) rows=(--seqlens 524288 --nheads 32 --causal 0) ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
python3 -c 'import torch; print(torch.cuda.device_count(), torch.cuda.get_device_name())' | tee $OUT/log.txt
timeout 570 python3 benchmarks/bench_context_parallel.py --nproc 2 --out-dir $OUT --tag h200x2_cp_$part "${rows[@]}" \
  > $OUT/bench_$part.txt 2>&1
echo "bench $part rc=$?" | tee -a $OUT/log.txt; grep "^{" $OUT/bench_$part.txt | cut -c1-400 | tee -a $OUT/log.txt
tail -n 3 $OUT/bench_$part.txt | cut -c1-300 | tee -a $OUT/log.txt
