#!/usr/bin/env bash
# The FP8 cross-attention kernel's configurations, and the large-v3 engine alone with it, in one
# call of the device tool:  run(command="bash bench/gpu_fp8_tune_session.sh", carry=[".whl"])
# (ENGINE=0: the kernels only; TINY=1: also tiny.en's engine alone with PyTorch's attention and with
# the Triton self-attention)
source bench/gpu_setup.sh
echo "== quantize_into on the GPU against PyTorch's rounding; fill_cross per window, bf16 and FP8"
timeout 120 python3 - <<'PY'
import torch
from tideserve.worker.backends.torch_whisper import triton_kernels as fa
from tideserve.worker.backends.torch_whisper.model import Whisper, WhisperDims, KVCache
torch.manual_seed(0)
x = torch.randn(8, 1500, 1280, device="cuda", dtype=torch.bfloat16) * torch.rand(8, 1, 1, device="cuda", dtype=torch.bfloat16) * 10
xv = x.view(8, 1500, 20, 64).transpose(1, 2)
w8, ws = fa.quantize(xv)
dst = torch.zeros(10, 20, 1500, 64, device="cuda", dtype=torch.float8_e4m3fn); sc = torch.ones(10, 20, device="cuda")
rows = torch.tensor([9, 0, 3, 2, 1, 8, 4, 5], device="cuda")
fa.quantize_into(xv, dst, sc, rows)
print("rows: bytes equal", torch.equal(dst[rows].view(torch.uint8), w8.view(torch.uint8)), "scales equal", torch.allclose(sc[rows], ws, rtol=1e-6))
dims = WhisperDims.large_v3()
with torch.device("cuda"): m = Whisper(dims)
m = m.to(torch.bfloat16).eval()
enc = torch.randn(32, 1500, 1280, device="cuda", dtype=torch.bfloat16)
for fp8 in (False, True):
    c = KVCache(dims, 32, torch.bfloat16, torch.device("cuda"), cross_fp8=fp8)
    with torch.inference_mode():
        for _ in range(2): m.fill_cross(c, enc)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); [m.fill_cross(c, enc) for _ in range(5)]; b.record(); b.synchronize()
    print("fill_cross ms per window", "fp8" if fp8 else "bf16", a.elapsed_time(b) / 5 / 32)
PY
echo "== kernel configurations (bench/gpu_fp8_tune.py)"
timeout 120 python3 bench/gpu_fp8_tune.py --json $OUT/fp8_tune.json 2>&1 | grep -v Warn
echo "== the large-v3 encoder's parts (bench/gpu_encoder_parts.py)"
timeout 150 python3 bench/gpu_encoder_parts.py --json $OUT/encoder_parts.json 2>&1 | grep -v Warn
[ "${ENGINE:-1}" = 1 ] || exit 0
echo "== large-v3 engine alone: bf16, and fp8 + triton self-attention"
python3 bench/make_whisper_dir.py --size large-v3 --vocab-size 51864 --tokenizer /tmp/tiny-en/tokenizer.json --out /tmp/large-v3-random >/dev/null
timeout 170 python3 bench/gpu_e2e.py --model-dir /tmp/large-v3-random --clips .devdata/clips --out "$OUT" --fixed-tokens 100 --requests 600 --skip served,engine,hf,pipeline,hol --engine-sweep 64x16:sdpa,64x16:fp8:triton,128x16:fp8:triton 2>&1 | grep -v "^\[transformers\]\|Warning\|warn("
mv "$OUT/gpu_e2e.json" "$OUT/gpu_e2e_large_v3.json" 2>/dev/null
[ -n "${TINY:-}" ] || exit 0
echo "== tiny.en (real) engine alone: PyTorch's attention, and the Triton self-attention"
timeout 80 python3 bench/gpu_e2e.py --model-dir /tmp/tiny-en --clips .devdata/clips --out "$OUT" --requests 1500 --skip served,engine,hf,pipeline,hol --engine-sweep 64x16:sdpa,64x16:triton 2>&1 | grep -v "^\[transformers\]\|Warning\|warn("
echo "== tiny.en features: host ms per call of 11 windows (int16, 1-30 s) queued behind 8 ms of GPU work"
timeout 60 python3 - <<'PY'
import time, numpy as np, torch
from tideserve.worker.backends.torch_whisper.features import LogMel
lm = LogMel(80, torch.device("cuda"))
rng = np.random.default_rng(0)
wins = [(rng.standard_normal(int(s * 16000)) * 3000).astype(np.int16) for s in rng.uniform(1, 30, 11)]
for _ in range(5): lm(wins)
big = torch.randn(4096, 4096, device="cuda")
t = []
for _ in range(20):
    torch.cuda.synchronize()  # every earlier copy done: only waits on the queued work show
    for _ in range(3): big @ big
    t0 = time.perf_counter(); lm(wins); t.append(time.perf_counter() - t0)
torch.cuda.synchronize()
print("features call host ms, median", 1e3 * sorted(t)[10])
PY
