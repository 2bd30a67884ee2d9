#!/usr/bin/env bash
# Session 34, call 08 (nvidia-h200-x2, first lent this session; issue 12's GPU part, never run before): the 2-GPU
# NCCL test of ring and Ulysses context parallelism, then one row of the context-parallel benchmark (128k tokens,
# causal, 16 heads) if time is left. NVLink multicast stays off (KINDS.md).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
L=$OUT/log.txt
python3 -c 'import torch; print(torch.cuda.device_count(), torch.cuda.get_device_name())' | tee $L
nvidia-smi topo -m 2>&1 | head -6 | tee -a $L
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_distributed.py -m multigpu -rfE > $OUT/tests.txt 2>&1
echo "nccl test rc=$?" | tee -a $L; tail -n 4 $OUT/tests.txt | cut -c1-600 | tee -a $L
timeout 100 python3 benchmarks/bench_context_parallel.py --nproc 2 --out-dir $OUT --tag h200x2_cp_128k \
  --seqlens 131072 --nheads 16 --causal 1 --no-torch-cp > $OUT/bench.txt 2>&1
echo "bench rc=$?" | tee -a $L; tail -n 12 $OUT/bench.txt | cut -c1-300 | tee -a $L
