#!/usr/bin/env bash
# Everything issue 8 measures on the GPU machine, in one call of the device tool:
#   run(command="bash bench/gpu_session.sh", carry=[".whl", ".devdata"])
# .whl: wheels the machine lacks (pydantic and its core, av); .devdata: tokenizer.json and
# English clips. Results land in $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv

echo "== unit tests of the torch backend on this GPU"
python3 -m pytest -q --noconftest -p no:cacheprovider tests/unit/worker/test_torch_backend.py 2>&1 | tail -5

echo "== benchmark"
timeout 400 python3 bench/gpu_whisper.py --compile --json "$OUT/gpu_whisper.json" 2>&1 | grep -v "^\[transformers\]"

echo "== tideserve up on an h200 pool (random tiny weights)"
python3 bench/make_whisper_dir.py --size tiny --tokenizer .devdata/tokenizer.json --out /tmp/tiny-random
cat > /tmp/local.yaml <<YAML
cache_dir: /tmp/ts-cache
allowed_file_roots: [/tmp]
YAML
cat > /tmp/ep.yaml <<YAML
apiVersion: tideserve.io/v1alpha1
kind: InferenceEndpoint
metadata: {name: whisper-gpu}
spec:
  model:
    name: whisper-tiny-random
    backend: torch
    source: file:///tmp/tiny-random
    decoding: {beam_size: 1, without_timestamps: true, max_new_tokens: 100}
  batching: {max_batch_size: 32, max_queue_delay_ms: 10}
  pools:
    - name: h200
      accelerator: h200
      target: cuda-sm90-bf16
      replicas: {min: 1, max: 1}
      max_concurrency: 64
  gateway: {port: 8080}
YAML
python3 -m tideserve validate /tmp/ep.yaml
python3 -m tideserve up /tmp/ep.yaml --config /tmp/local.yaml --log-format text > "$OUT/up.log" 2>&1 &
UP=$!
python3 bench/gpu_serve_check.py --url http://127.0.0.1:8080 --audio .devdata/*.wav --requests 64 --out "$OUT/serve" 2>&1 | tail -30
python3 -m tideserve status --url http://127.0.0.1:8080 2>&1 | tail -8
kill -INT $UP; wait $UP
echo "up exited $?"
