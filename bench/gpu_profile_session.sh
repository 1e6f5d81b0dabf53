#!/usr/bin/env bash
# A simulator profile of the torch backend on the GPU machine, with the real tiny.en weights
# (shipped as int8 by `bench/gpu_parity.py pack`, expanded to float16 there):
#   run(command="bash bench/gpu_profile_session.sh", carry=[".devpar", ".whl-small"])
# The pool is declared as an h100 (same compute capability, sm_90) so that the simulator can
# price it with the catalog's p5.48xlarge; the profile's metadata names the GPU it ran on.
set -u
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-small/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
python3 bench/gpu_parity.py unpack .devpar /tmp/tiny-en
cat > /tmp/local.yaml <<YAML
cache_dir: /tmp/ts-cache
allowed_file_roots: [/tmp]
YAML
cat > /tmp/ep-prof.yaml <<YAML
apiVersion: tideserve.io/v1alpha1
kind: InferenceEndpoint
metadata: {name: whisper-sim-gpu}
spec:
  model:
    name: whisper-tiny.en
    backend: torch
    source: file:///tmp/tiny-en
    decoding: {beam_size: 1, without_timestamps: false}
  batching: {max_batch_size: 64, max_queue_delay_ms: 10}
  pools:
    - {name: h100, accelerator: h100, target: cuda-sm90-bf16, replicas: {min: 0, max: 4}}
YAML
python3 -m tideserve bench profile /tmp/ep-prof.yaml --batch-sizes 1,2,4,8,16,32,64 --audio-s 5,15,30 \
  --repeats 5 --speech .devpar --config /tmp/local.yaml -o "$OUT/gpu-h200-tiny-en.json"
