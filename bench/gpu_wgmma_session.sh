#!/usr/bin/env bash
# One device call for the absorbed cross-attention's warp-group kernel (cuda_kernels.absorbed_wgmma,
# the build WGMMA; README, Serving path (19)):
#   run(command="bash bench/gpu_wgmma_session.sh", carry=[".whl", ".devdata"], kind="nvidia-h100-x1")
# 1. its output against absorbed_attend_reference (bench/absorbed_mma.py; exit 1 above 0.05 of the
#    largest value), and if that fails, the build with the descriptors' two offsets swapped (WG_SWAP);
#    and the candidate WG_PROMOTE (each block's products added in float32);
# 2. 32 layers at 128 and 64 rows against the mma.sync kernel and the served FP8 keys and values,
#    and its builds without products (bench/gpu_absorbed_attend.py);
# 3. the engine at large-v3 size (random weights, 100 tokens a window, 128 rows): the served FP8 keys
#    and values and, if it matched, the absorbed cache on it (TIDESERVE_ABSORBED_BUILD), each also
#    with windows encoded while the rows decode (overlap128);
# 4. one launch under Nsight Compute, summarised (bench/ncu_sass_summary.py), if time is left.
# Results in $OUT: check_wgmma*.txt, absorbed_wgmma.json, engine_sweep.json, ncu_wgmma.txt,
# sass_wgmma.txt.
source bench/gpu_setup.sh
nvidia-smi --query-gpu=name --format=csv,noheader
W=WGMMA OK=1
if timeout 90 python3 bench/absorbed_mma.py WGMMA > "$OUT/check_wgmma.txt" 2>&1; then echo "WGMMA: matches its reference"; else
  OK=0
  tail -12 "$OUT/check_wgmma.txt"
  if timeout 60 python3 bench/absorbed_mma.py WGMMA,WG_SWAP > "$OUT/check_wgmma_swap.txt" 2>&1; then
    echo "WGMMA+WG_SWAP: matches its reference"; W=WGMMA+WG_SWAP OK=0
  else tail -6 "$OUT/check_wgmma_swap.txt"; fi
fi
# the candidate that adds each block's products in float32 (README, Serving path (19))
timeout 90 python3 bench/absorbed_mma.py "${W/+/,},WG_PROMOTE" > "$OUT/check_wgmma_promote.txt" 2>&1; tail -1 "$OUT/check_wgmma_promote.txt"
grep -v "^$" "$OUT/check_wgmma.txt" | tail -3
timeout 200 python3 bench/gpu_absorbed_attend.py --json "$OUT/absorbed_wgmma.json" --rows 128,64 --no-compile \
  --configs "m/1,m/1/$W,m/2/$W,m/1/$W+WG_PROMOTE,m/1/$W+WG_SKIP_SCORES,m/1/$W+WG_SKIP_OUTPUT,m/1/$W+WG_SKIP_SCORES+WG_SKIP_OUTPUT" 2>&1 \
  | grep -v -i warn | cut -c1-250
# the engine at large-v3 size, in one process (configs in order of weight; each saved as it ends):
# the served FP8 keys and values, the absorbed cache on this kernel, each with windows encoded
# while the rows decode (overlap128: EngineLoop(encode_ahead=128), README, The served path (21))
python3 bench/make_whisper_dir.py --size large-v3 --vocab-size 51864 --tokenizer /tmp/tiny-en/tokenizer.json \
  --out /tmp/large-v3-random >/dev/null
if [ "$OK" = 1 ]; then B=WGMMA SW=128x0:fp8,128x0:fp8:absorbed,128x0:fp8:overlap128,128x0:fp8:absorbed:overlap128
else B=mma SW=128x0:fp8,128x0:fp8:overlap128; fi
echo "== engine, build $B: $SW ($SECONDS s)"
TIDESERVE_ABSORBED_BUILD=$B timeout $((500 - SECONDS)) python3 bench/gpu_e2e.py --model-dir /tmp/large-v3-random \
  --clips .devdata/clips --out /tmp/e2e_eng --fixed-tokens 100 --requests 1000 --batch 128 \
  --kv-cache-dtype fp8 --skip served,hf,pipeline,hol,engine --engine-sweep "$SW" 2>&1 \
  | grep -v "^\[transformers\]\|Warning\|warn(" | grep "rtfx" | cut -c1-900
cp /tmp/e2e_eng/gpu_e2e.json "$OUT/engine_sweep.json" 2>/dev/null
[ "$SECONDS" -gt 470 ] && { echo "no time left for Nsight Compute ($SECONDS s)"; exit 0; }
timeout $((580 - SECONDS)) ncu --clock-control none --kernel-name absorbed_wgmma --launch-skip 1 --launch-count 1 --set full \
  --import-source no -o /tmp/rep_wg -f python3 bench/absorbed_profile.py --builds "$W" > /tmp/ncu_wg.log 2>&1
tail -2 /tmp/ncu_wg.log
ncu -i /tmp/rep_wg.ncu-rep --page details > "$OUT/ncu_wgmma.txt" 2>&1
ncu -i /tmp/rep_wg.ncu-rep --page source --csv --print-source sass > /tmp/sass_wg.csv 2>&1
python3 bench/ncu_sass_summary.py /tmp/sass_wg.csv --units 3072 --top 25 > "$OUT/sass_wgmma.txt" 2>&1
grep -E "Duration|DRAM Throughput|Registers Per|Issue Slots" "$OUT/ncu_wgmma.txt"; head -14 "$OUT/sass_wgmma.txt"
