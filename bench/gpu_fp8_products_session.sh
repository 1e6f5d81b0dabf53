#!/usr/bin/env bash
# FP8 matrix products (bench/fp8_linear.py) and the compiled step at tiny size on the GPU, in
# calls of the device tool, one per group of parts:
#   run(command="bash bench/gpu_fp8_products_session.sh 1,2", carry=[".whl", ".devdata"])
#   run(command="bash bench/gpu_fp8_products_session.sh 3", carry=[".whl", ".devdata"])
#   run(command="bash bench/gpu_fp8_products_session.sh 4", carry=[".whl", ".devdata"])
# (the parts below; together they exceed one call's 10 minutes)
# 1. large-v3 shapes: ms per compiled decoder step and per encoder window, bf16 against FP8
#    products (bench/gpu_autotune.py --variants whole,whole-fp8w);
# 2. real tiny.en: the long files' segments with and without FP8 products (score here:
#    python bench/accuracy_gpu.py score FILE), and the engine alone, the compiled step and FP8
#    products each against the default engine's text (gpu_e2e.py's engine sweep, wer_vs_engine);
# 3. large-v3 shapes, engine alone at batch 64 with FP8 keys and values, then Hugging Face
#    generate in a fresh process and again in this process (--hf-also-in-process).
# 4. real tiny.en with the whole decoder step compiled (off by default at its size): the long files'
#    segments, then served at 256 clients against the default, taking turns (bench/gpu_served_ab.sh).
# Results land in $OUT. Env: REQS (large-v3 requests, default 600), ROUNDS (part 4, default 2).
# Results of 2026-12-06 (an H100): bench/results/gpu_fp8_products_h100.json.
source bench/gpu_setup.sh
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
PARTS=",${1:-1,2,3},"
if [[ $PARTS == *,1,* ]]; then
echo "== 1. step and encoder, large-v3 shapes: bf16 against FP8 products"
timeout 280 python3 bench/gpu_autotune.py --variants whole,whole-fp8w --json "$OUT/autotune_fp8w.json" 2>&1 \
  | grep -v "Warning\|warn("
fi
if [[ $PARTS == *,2,* ]]; then
echo "== 2. tiny.en: accuracy and agreement"
timeout 100 python3 bench/accuracy_gpu.py run .devdata/tiny-en "$OUT/acc_bf16.json" --minutes 1,5,20 2>&1 | tail -1
timeout 100 python3 bench/accuracy_gpu.py run .devdata/tiny-en "$OUT/acc_fp8w.json" --minutes 1,5,20 --weights-fp8 2>&1 | tail -1
timeout 180 python3 bench/gpu_e2e.py --model-dir /tmp/tiny-en --clips .devdata/clips --out "$OUT/tiny" --requests 1000 \
  --skip served,hf,pipeline,hol --engine-sweep 64x16:stepcompile,64x16:fp8w 2>&1 | grep -v "^\[transformers\]\|Warning\|warn("
fi
if [[ $PARTS == *,3,* ]]; then
echo "== 3. large-v3 shapes: engine, generate both ways"
python3 bench/make_whisper_dir.py --size large-v3 --vocab-size 51864 --tokenizer /tmp/tiny-en/tokenizer.json \
  --out /tmp/large-v3-random >/dev/null
timeout 560 python3 bench/gpu_e2e.py --model-dir /tmp/large-v3-random --clips .devdata/clips --out "$OUT/large" \
  --fixed-tokens 100 --requests "${REQS:-600}" --kv-cache-dtype fp8 --skip served,pipeline,hol --hf-also-in-process \
  2>&1 | grep -v "^\[transformers\]\|Warning\|warn("
fi
if [[ $PARTS == *,4,* ]]; then
echo "== 4. tiny.en, the whole step compiled: accuracy, then served against the default (ab)"
timeout 100 python3 bench/accuracy_gpu.py run .devdata/tiny-en "$OUT/acc_compiled_step.json" --minutes 1,5,20 --compile-step 2>&1 | tail -1
cat > /tmp/patch_step.py <<'PY'
import pathlib
p = pathlib.Path("src/tideserve/worker/backends/torch_whisper/decode.py")
s = p.read_text()
old = 'return CompiledEncoder.enabled_for(model, device) and model.attention == "triton"'
assert old in s
p.write_text(s.replace(old, 'return device.type == "cuda"'))
PY
ROUNDS=${ROUNDS:-2} bash bench/gpu_served_ab.sh "step=exec(open('/tmp/patch_step.py').read())"
fi
