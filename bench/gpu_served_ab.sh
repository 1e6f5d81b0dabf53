#!/usr/bin/env bash
# Served tiny.en, the tree as it is against patched copies of it, taking turns, in one call of the
# device tool (issue 12: GPU busy at saturation; a served run is ~2,000 requests in seconds, so
# several fit in one call and machine noise is shared):
#   run(command="ROUNDS=2 bash bench/gpu_served_ab.sh 'A=<python patch>' 'B=<python patch>'",
#       carry=[".whl", ".devdata"])
# Each argument NAME=CODE is a Python snippet run in the repository root that edits the sources
# (e.g. a str.replace on one file); every variant starts from the tree as carried. Per round: the
# base, then each variant; results in $OUT/ab/<round>_<name>/gpu_e2e.json and one line per run on
# stdout (audio-s/s, GPU busy, p50/p99 at CONC clients). Env: CONC (256), REQS (2000), ROUNDS (1).
source bench/gpu_setup.sh
set -o pipefail
CONC=${CONC:-256}; REQS=${REQS:-2000}; ROUNDS=${ROUNDS:-1}
snapshot=$(mktemp -d)
cp -a src "$snapshot/src"
serve() {  # $1: run name
  mkdir -p "$OUT/ab/$1"
  timeout 150 python3 bench/gpu_e2e.py --model-dir /tmp/tiny-en --clips .devdata/clips --out "$OUT/ab/$1" \
    --skip engine,hf,pipeline,hol --concurrency "$CONC" --requests "$REQS" >"$OUT/ab/$1/log.txt" 2>&1
  python3 - "$OUT/ab/$1/gpu_e2e.json" "$1" <<'EOF'
import json, sys
try:
    s = json.load(open(sys.argv[1]))["served"][-1]
    print(f"{sys.argv[2]}: {s['rtfx']:.0f} audio-s/s, GPU busy {s['gpu_busy']:.3f}, p50/p99 {s['p50_s']:.2f}/{s['p99_s']:.2f} s, ok {s['ok']}/{s['requests']}", flush=True)
except Exception as exc:
    print(f"{sys.argv[2]}: no result ({exc})", flush=True)
EOF
}
for r in $(seq 1 "$ROUNDS"); do
  serve "${r}_base"
  for arg in "$@"; do
    name=${arg%%=*}; code=${arg#*=}
    python3 -c "$code" || { echo "$name: the patch failed"; continue; }
    serve "${r}_${name}"
    rm -rf src && cp -a "$snapshot/src" src
  done
done
