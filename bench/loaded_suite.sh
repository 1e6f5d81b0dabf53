#!/usr/bin/env bash
# Issue 20: run the test suite several times in a row on a machine kept busy, to find tests whose
# verdict depends on the machine's speed. The load is one busy loop per core (plain shell
# arithmetic at the default nice level, so the tests get about half of each core), bounded by
# `timeout` so it can never outlive this script.
#   bench/loaded_suite.sh [runs] [busy loops]     (defaults: 5 runs, one loop per core)
# Writes one line per run (exit status, seconds, the summary line) to bench/results/loaded_suite.txt
# and each run's full output beside it in $TMPDIR. Needs `make .venv/.test-installed` first.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
LOOPS=${2:-$(nproc)}
OUT=bench/results/loaded_suite.txt
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/loaded-suite.XXXXXX")
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD): $RUNS runs, $LOOPS busy loops on $(nproc) cores; logs in $LOGDIR" | tee -a "$OUT"
pids=()
for _ in $(seq "$LOOPS"); do
    timeout 4h bash -c 'while :; do :; done' & pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
for i in $(seq "$RUNS"); do
    t0=$(date +%s)
    .venv/bin/pytest -q -p no:cacheprovider > "$LOGDIR/run$i.log" 2>&1
    rc=$?
    line="run $i: exit $rc, $(( $(date +%s) - t0 )) s, $(tail -n 1 "$LOGDIR/run$i.log")"
    echo "$line" | tee -a "$OUT"
    grep -E "^(FAILED|ERROR) " "$LOGDIR/run$i.log" | tee -a "$OUT"
done
