#!/usr/bin/env bash
# One device call for the absorbed cross-attention's loads (README, Serving path (23)): the warp-group
# kernel brings E's blocks in by cp.async in 64-byte pieces into an unswizzled layout; two candidates
# bring them in whole 128-byte lines into the 128-byte swizzle (WG_SW128, cp.async) or by Hopper's
# tensor copies (WG_TMA, one thread, the swizzle done by the copy engine):
#   run(command="bash bench/gpu_absorbed_load_session.sh", carry=[".whl", ".devdata"], kind="nvidia-h100-x1")
# 1. each candidate's output against absorbed_attend_reference (bench/absorbed_mma.py; 0.05 of the
#    largest value at most);
# 2. 32 layers at 128 and 256 rows, each build and its diagnostic without anything but the loads
#    (WG_LOADS_ONLY: the floor of its way of loading), side by side (bench/gpu_absorbed_attend.py);
# 3. if a candidate matched and beat WGMMA at 256 rows by more than 3%: the engine at large-v3 size
#    (random weights, 100 tokens a window, 1,000 requests, 256 rows, absorbed), WGMMA and then that
#    candidate, one process each (TIDESERVE_ABSORBED_BUILD is read once a process).
# Results in $OUT: check_*.txt, absorbed_load.json, engine_<build>.json.
source bench/gpu_setup.sh
nvidia-smi --query-gpu=name --format=csv,noheader
GOOD=""
for B in WGMMA,WG_SW128 WGMMA,WG_TMA; do
  if timeout 90 python3 bench/absorbed_mma.py "$B" > "$OUT/check_${B/,/_}.txt" 2>&1; then echo "$B: matches its reference"; GOOD="$GOOD $B"
  else echo "$B: does not match"; grep -v "^$" "$OUT/check_${B/,/_}.txt" | tail -8 | cut -c1-300; fi
done
# only the builds that matched (one that hangs or faults would take the call with it)
CFG=m/1/WGMMA,m/1/WGMMA+WG_LOADS_ONLY
for B in $GOOD; do CFG="$CFG,m/1/${B/,/+},m/1/${B/,/+}+WG_LOADS_ONLY"; done
timeout 240 python3 bench/gpu_absorbed_attend.py --json "$OUT/absorbed_load.json" --rows 128,256 --no-compile \
  --configs "$CFG" 2>&1 \
  | grep -v -i warn | grep -v " fill \| block " | cut -c1-220
BEST=$(python3 - "$OUT/absorbed_load.json" "$GOOD" <<'PY'
import json, sys
rows = {r["rows"]: r["kernel"] for r in json.load(open(sys.argv[1]))["rows"]}
k = rows.get(256, {})
base = k.get("m/1/WGMMA", {}).get("ms")
good = {b: k[f"m/1/{b.replace(',', '+')}"]["ms"] for b in sys.argv[2].split() if "ms" in k.get(f"m/1/{b.replace(',', '+')}", {})}
best = min(good, key=good.get) if good else ""
print(best if best and base and good[best] < 0.97 * base else "")
PY
)
echo "== best candidate at 256 rows: ${BEST:-none} ($SECONDS s)"
[ -z "$BEST" ] && exit 0
python3 bench/make_whisper_dir.py --size large-v3 --vocab-size 51864 --tokenizer /tmp/tiny-en/tokenizer.json \
  --out /tmp/large-v3-random >/dev/null
for B in WGMMA "$BEST"; do
  left=$((585 - SECONDS)); [ "$left" -lt 100 ] && { echo "no time left for the engine with $B"; break; }
  echo "== engine, build $B ($SECONDS s)"
  TIDESERVE_ABSORBED_BUILD=$B timeout $left python3 bench/gpu_e2e.py --model-dir /tmp/large-v3-random \
    --clips .devdata/clips --out /tmp/e2e_$B --fixed-tokens 100 --requests 1000 --batch 256 \
    --kv-cache-dtype fp8 --skip served,hf,pipeline,hol,engine --engine-sweep 256x0:fp8:absorbed 2>&1 \
    | grep -v "^\[transformers\]\|Warning\|warn(" | grep "rtfx" | cut -c1-700
  cp "/tmp/e2e_$B/gpu_e2e.json" "$OUT/engine_${B/,/_}.json" 2>/dev/null
done
