#!/usr/bin/env bash
# scripts/consan_gluon.py past one device call's 10 minutes: the ConSan-instrumented 192/128 backward spends longer
# than that in ptxas (benchmarks/NOTES.md, fifteenth and sixteenth sessions). `start` launches the run in a process
# session of its own (it outlives the call while the machine stays warm), with Triton's cache in build/ (ignored, so
# a warm machine keeps it) and PTXAS_OPTIONS (default "--opt-level 1"); `wait` follows it, up to SECONDS, and copies
# its log to $OUT. Run `wait` in the next call within the machine's 30 s warm window, and again while it runs.
#   bash scripts/consan_detached.sh start ARGS...      (ARGS: consan_gluon.py's, e.g. mla-pass bwd)
#   bash scripts/consan_detached.sh wait [SECONDS]
# CONSAN_RUN=NAME keeps a run (its log, status and Triton cache) under build/NAME, so that runs with other
# PTXAS_OPTIONS can go side by side (the cache key may not see the ptxas options).
set -uo pipefail
cd "$(dirname "$0")/.."
RUN=build/${CONSAN_RUN:-consan-detached}
mkdir -p "$RUN"
# the run's process is alive (a zombie left unreaped, as in some containers, is not)
alive() { [ -f "$RUN/pid" ] && ps -o stat= -p "$(cat "$RUN/pid")" 2>/dev/null | grep -qv Z; }
case "${1:-}" in
  start)
    shift
    alive && { echo "a run is going: $(cat "$RUN/args")"; exit 1; }
    echo "$*" > "$RUN/args"
    rm -f "$RUN/rc"
    PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/$RUN/triton-cache" \
      PTXAS_OPTIONS="${PTXAS_OPTIONS:---opt-level 1}" \
      setsid bash -c 'date -u; python3 scripts/consan_gluon.py "$@"; echo $? > '"$RUN/rc"'; date -u' _ "$@" \
      > "$RUN/log" 2>&1 < /dev/null &
    echo $! > "$RUN/pid"
    echo "started consan_gluon.py $* (pid $(cat "$RUN/pid")); log: $RUN/log"
    ;;
  wait)
    limit=${2:-540}
    for _ in $(seq "$limit"); do
      [ -f "$RUN/rc" ] && break
      alive || break  # gone without a status: killed
      sleep 1
    done
    tail -n 20 "$RUN/log"
    [ -n "${OUT:-}" ] && cp "$RUN/log" "$OUT/$(basename "$RUN").log"
    if [ -f "$RUN/rc" ]; then
      echo "finished: rc=$(cat "$RUN/rc") ($(cat "$RUN/args"))"
      exit "$(cat "$RUN/rc")"
    fi
    if alive; then
      echo "still running after ${limit} s: call wait again"
      exit 3
    fi
    echo "the run ended without an exit status (killed?)"
    exit 4
    ;;
  *)
    echo "usage: bash scripts/consan_detached.sh start ARGS... | wait [SECONDS]" >&2
    exit 2
    ;;
esac
