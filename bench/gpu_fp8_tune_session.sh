#!/usr/bin/env bash
# The FP8 cross-attention kernel's configurations, and the large-v3 engine alone with it, in one
# call of the device tool:  run(command="bash bench/gpu_fp8_tune_session.sh", carry=[".whl"])
source bench/gpu_setup.sh
echo "== kernel configurations (bench/gpu_fp8_tune.py)"
timeout 300 python3 bench/gpu_fp8_tune.py --json $OUT/fp8_tune.json 2>&1 | grep -v Warn
echo "== large-v3 engine alone: bf16, and fp8 + triton self-attention"
python3 bench/make_whisper_dir.py --size large-v3 --vocab-size 51864 --tokenizer /tmp/tiny-en/tokenizer.json --out /tmp/large-v3-random >/dev/null
timeout 200 python3 bench/gpu_e2e.py --model-dir /tmp/large-v3-random --clips .devdata/clips --out "$OUT" --fixed-tokens 100 --requests 800 --skip served,engine,hf,pipeline,hol --engine-sweep 64x16,64x16:fp8:triton,128x16,128x16:fp8:triton 2>&1 | grep -v "^\[transformers\]\|Warning\|warn("
