# Sourced by the GPU session scripts (bench/gpu_e2e_session.sh, gpu_served_profile.sh,
# gpu_sweep_session.sh) on the device machine: $OUT exists, the carried wheels (.whl: pydantic and
# its dependencies, which that machine lacks) are importable with tideserve's sources, and the real
# tiny.en weights (.devdata/tiny-en, packed as int8 by `bench/gpu_parity.py pack`) are unpacked to
# /tmp/tiny-en in fp16.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
python3 bench/gpu_parity.py unpack .devdata/tiny-en /tmp/tiny-en >/dev/null
