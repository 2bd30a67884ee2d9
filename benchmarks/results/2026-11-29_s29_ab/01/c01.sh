#!/usr/bin/env bash
# session 29 call 01: n50 (tests + four Triton-forward A/Bs) then n51 (V copy sweep)
set -uo pipefail
ROOT=$OUT
mkdir -p $ROOT/n50 $ROOT/n51
OUT=$ROOT/n50 bash .calls/n50.sh
OUT=$ROOT/n51 bash .calls/n51.sh
