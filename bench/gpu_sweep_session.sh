#!/usr/bin/env bash
# The engine alone on the H200 at other batch sizes and decode-chunk lengths, plus a py-spy profile
# of the engine loop (issue 12: what sets the GPU busy fraction), in one call of the device tool:
#   run(command="bash bench/gpu_sweep_session.sh", carry=[".whl", ".devdata"])
# .whl and .devdata as for bench/gpu_e2e_session.sh; .devdata/py-spy is py-spy's binary (pip install
# --target DIR py-spy here, copy DIR/bin/py-spy). Results land in $OUT (committed as
# bench/results/gpu_engine_sweep_h200.json). SWEEP: the configurations; SKIP: parts of gpu_e2e.py
# to skip (default served,hol); PROFILE=0: no profile.
source bench/gpu_setup.sh
timeout 300 python3 bench/gpu_e2e.py --model-dir /tmp/tiny-en --clips .devdata/clips --out "$OUT" --skip "${SKIP:-served,hol}" \
  --engine-sweep "${SWEEP:-64x16:nograph,64x16,64x32,128x16}" 2>&1 | grep -v "^\[transformers\]\|Warning\|warn(\|Loading weights"
mv "$OUT/gpu_e2e.json" "$OUT/gpu_e2e_sweep.json"
[ "${PROFILE:-1}" = 1 ] || exit 0
timeout 120 .devdata/py-spy record -r 250 --format raw -o "$OUT/engine_profile.raw" -- python3 bench/gpu_e2e.py \
  --model-dir /tmp/tiny-en --clips .devdata/clips --out /tmp/prof --skip served,hf,pipeline,hol --requests 2000 2>&1 | tail -5
