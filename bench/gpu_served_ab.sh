#!/usr/bin/env bash
# Served tiny.en, the tree as it is against patched copies of it, taking turns, in one call of the
# device tool (issue 12: GPU busy at saturation; a served run is ~2,000 requests in seconds, so
# several fit in one call and machine noise is shared):
#   run(command="ROUNDS=2 bash bench/gpu_served_ab.sh 'A=<python patch>' 'B=<python patch>'",
#       carry=[".whl", ".devdata"])
# Each argument NAME=CODE is a Python snippet run in the repository root that edits files under
# src/ (e.g. a str.replace on one file); a snippet that fails or changes nothing under src/ is
# reported and skipped. Every run starts from the tree as carried (src/ is restored from a snapshot
# before each run and on exit). Per round: the base, then each variant; even rounds run them in
# reverse order. Each run serves on its own port; results in $OUT/ab/<round>_<name>/ (gpu_e2e.json,
# log.txt, up.log, patch.py) and one line per run on stdout (audio-s/s, GPU busy, p50/p99 at CONC
# clients). Env: CONC (256), REQS (2000), ROUNDS (1).
source bench/gpu_setup.sh
CONC=${CONC:-256}; REQS=${REQS:-2000}; ROUNDS=${ROUNDS:-1}
snapshot=$(mktemp -d)
cp -a src "$snapshot/src"
restore() { rm -rf src && cp -a "$snapshot/src" src; }
trap 'restore; rm -rf "$snapshot"' EXIT
port=18100
serve() {  # $1: run name. SIGINT first: gpu_e2e.py then stops its `tideserve up` (its finally).
  mkdir -p "$OUT/ab/$1"
  port=$((port + 1))
  timeout -s INT -k 30 150 python3 bench/gpu_e2e.py --model-dir /tmp/tiny-en --clips .devdata/clips \
    --out "$OUT/ab/$1" --port "$port" --skip engine,hf,pipeline,hol --concurrency "$CONC" --requests "$REQS" \
    >"$OUT/ab/$1/log.txt" 2>&1
  cp /tmp/gpu_e2e/up.log "$OUT/ab/$1/up.log" 2>/dev/null
  python3 - "$OUT/ab/$1/gpu_e2e.json" "$1" <<'EOF'
import json, sys
try:
    s = json.load(open(sys.argv[1]))["served"][-1]
    print(f"{sys.argv[2]}: {s['rtfx']:.0f} audio-s/s, GPU busy {s['gpu_busy']:.3f}, p50/p99 {s['p50_s']:.2f}/{s['p99_s']:.2f} s, ok {s['ok']}/{s['requests']}", flush=True)
except Exception as exc:
    print(f"{sys.argv[2]}: no result ({exc})", flush=True)
EOF
}
variant() {  # $1: round, $2: NAME=CODE or "base"
  restore
  if [ "$2" = base ]; then serve "$1_base"; return; fi
  local name=${2%%=*} code=${2#*=}
  mkdir -p "$OUT/ab/$1_$name"
  printf '%s\n' "$code" > "$OUT/ab/$1_$name/patch.py"
  if ! python3 -c "$code"; then echo "$1_$name: the patch failed; skipped"; return; fi
  if diff -rq "$snapshot/src" src >/dev/null; then echo "$1_$name: the patch changed nothing under src/; skipped"; return; fi
  serve "$1_$name"
}
for r in $(seq 1 "$ROUNDS"); do
  runs=(base "$@")
  if [ $((r % 2)) -eq 0 ]; then
    for ((i = ${#runs[@]} - 1; i >= 0; i--)); do variant "$r" "${runs[i]}"; done
  else
    for run in "${runs[@]}"; do variant "$r" "$run"; done
  fi
done
