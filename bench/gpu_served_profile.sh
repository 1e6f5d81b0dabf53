#!/usr/bin/env bash
# A py-spy profile of the served path on the GPU machine (issue 12: where the engine process's
# host time goes when requests come through HTTP), in one call of the device tool:
#   run(command="bash bench/gpu_served_profile.sh", carry=[".whl", ".devdata"])
# .whl, .devdata as for bench/gpu_e2e_session.sh (.devdata/py-spy: py-spy's binary). Samples every
# process of `tideserve up` (gateway, worker front, prep processes, engine) by thread, 200 Hz, while
# gpu_e2e.py serves CONC clients (default 256) REQS requests (default 3000); the collapsed stacks land
# in $OUT/served_profile.raw (read them with bench/profile_summary.py). PREP: prep processes (0: default).
source bench/gpu_setup.sh
timeout 400 .devdata/py-spy record -r 200 --subprocesses --threads --nonblocking --format raw -o "$OUT/served_profile.raw" -- \
  python3 bench/gpu_e2e.py --model-dir /tmp/tiny-en --clips .devdata/clips --out "$OUT" --skip engine,hf,pipeline,hol \
  --concurrency "${CONC:-256}" --requests "${REQS:-3000}" --prep-processes "${PREP:-0}" 2>&1 | grep -v "^\[transformers\]\|Warning\|warn(" | tail -8
cp /tmp/gpu_e2e/worker_metrics.txt "$OUT/" 2>/dev/null
ls -la "$OUT"
