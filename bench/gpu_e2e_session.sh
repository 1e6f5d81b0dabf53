#!/usr/bin/env bash
# Issue 12's measurements on the GPU machine, in one call of the device tool:
#   run(command="bash bench/gpu_e2e_session.sh tiny", carry=[".whl", ".devdata"])
#   run(command="bash bench/gpu_e2e_session.sh large-v3", carry=[".whl", ".devdata"])
# .whl: pydantic and its dependencies (the machine lacks them); .devdata: the real tiny.en
# weights packed as int8 by `bench/gpu_parity.py pack` (expanded to fp16 there) and the English
# clips. Results land in $OUT. Env: CONC, REQS, BATCH (gpu_e2e.py's --concurrency, --requests,
# --batch); SKIP: its --skip; SWEEP: extra in-process engine runs, gpu_e2e.py's --engine-sweep;
# KV (large-v3): the served model's kv_cache_dtype (auto or fp8); CROSS (large-v3): its cross_attention
# (kv or absorbed, with KV=fp8; TIDESERVE_ABSORBED_BUILD picks the kernel); AHEAD (large-v3): its
# batching.encode_ahead (windows encoded while the rows decode; 0: off); HF_BATCH: Hugging Face's batch (default BATCH);
# PROFILE: that many requests through the engine under PyTorch's profiler (gpu_e2e.py's --profile-requests).
source bench/gpu_setup.sh
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
nproc
case "${1:-tiny}" in
tiny)
  echo "== torch backend and continuous batching tests on this GPU"
  timeout 240 python3 -m pytest -q --noconftest -p no:cacheprovider tests/unit/worker/test_torch_backend.py \
    tests/unit/worker/test_continuous_batching.py 2>&1 | tail -4
  echo "== end to end, real tiny.en weights"
  timeout 520 python3 bench/gpu_e2e.py --model-dir /tmp/tiny-en --clips .devdata/clips --out "$OUT" \
    --concurrency "${CONC:-64,256}" --requests "${REQS:-2000}" --batch "${BATCH:-64}" --skip "${SKIP:-}" \
    ${SWEEP:+--engine-sweep "$SWEEP"} ${PROFILE:+--profile-requests "$PROFILE"} 2>&1 | grep -v "^\[transformers\]\|Warning\|warn("
  cp /tmp/gpu_e2e/worker_metrics.txt "$OUT/" 2>/dev/null
  tail -20 /tmp/gpu_e2e/up.log > "$OUT/up_tail.log" 2>/dev/null
  ;;
large-v3)
  echo "== end to end, large-v3 shapes, random weights, 100 tokens per window"
  python3 bench/make_whisper_dir.py --size large-v3 --vocab-size 51864 --tokenizer /tmp/tiny-en/tokenizer.json \
    --out /tmp/large-v3-random >/dev/null
  timeout 540 python3 bench/gpu_e2e.py --model-dir /tmp/large-v3-random --clips .devdata/clips --out "$OUT" \
    --fixed-tokens 100 --concurrency "${CONC:-64,256}" --requests "${REQS:-2000}" --skip "${SKIP:-pipeline,hol}" \
    --batch "${BATCH:-64}" ${HF_BATCH:+--hf-batch "$HF_BATCH"} --kv-cache-dtype "${KV:-auto}" --cross-attention "${CROSS:-kv}" \
    --encode-ahead "${AHEAD:-0}" ${SWEEP:+--engine-sweep "$SWEEP"} ${PROFILE:+--profile-requests "$PROFILE"} 2>&1 \
    | grep -v "^\[transformers\]\|Warning\|warn("
  mv "$OUT/gpu_e2e.json" "$OUT/gpu_e2e_large_v3.json"
  tail -20 /tmp/gpu_e2e/up.log > "$OUT/up_tail.log" 2>/dev/null
  ;;
esac
