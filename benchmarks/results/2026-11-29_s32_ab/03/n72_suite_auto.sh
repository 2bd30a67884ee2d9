#!/usr/bin/env bash
# Session 32 call 03: the whole GPU suite under auto (Tiles through every TMA launch, Triton's and Gluon's; auto's
# latent rule dropped), then latent host and GPU time per call, Triton against Gluon (this tree).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/scripts
L=$OUT/log.txt
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)' | tee $L
timeout 420 python3 -m pytest -q -n 16 -p no:cacheprovider tests --ignore=tests/test_long_rows.py -rfE > $OUT/suite_auto.txt 2>&1
echo "suite under auto rc=$?" | tee -a $L; tail -n 4 $OUT/suite_auto.txt | tee -a $L
pkill -f "pytest" ; sleep 2
timeout 100 python3 scripts/host_vs_gpu.py --latent --out $OUT/latent_host.json 2>&1 | grep -v Warn | tee -a $L
