#!/usr/bin/env bash
# FP8 cross-attention keys and values (issue 12, large-v3) and the torch backend's accuracy on the
# H200 (issue 13), in one call of the device tool:
#   run(command="bash bench/gpu_fp8_session.sh", carry=[".whl"])
# (.devdata, untracked, travels with the tree.) Results land in $OUT: step_parts_fp8.json,
# acc_gpu.json and acc_gpu_fp8.json (score here: python bench/accuracy_gpu.py score FILE), gpu_e2e.json.
source bench/gpu_setup.sh
python3 -c "import torch,triton;print(torch.__version__,triton.__version__,torch.cuda.get_device_name(0))"
echo "== fp8 attention vs reference on the GPU"
timeout 60 python3 - <<'PY'
import torch
from tideserve.worker.backends.torch_whisper import triton_kernels as fa
torch.manual_seed(0)
k=torch.randn(70,20,1500,64,device="cuda",dtype=torch.bfloat16); v=torch.randn_like(k); q=torch.randn(64,20,64,device="cuda",dtype=torch.bfloat16)*3
k8,ks=fa.quantize(k); v8,vs=fa.quantize(v)
ref=torch.nn.functional.scaled_dot_product_attention(q[:,:,None].float(),(k8.float()*ks[:,:,None,None])[:64],(v8.float()*vs[:,:,None,None])[:64])[:,:,0]
for s in (1,4): print("split",s,"max err",(fa.attend(q,k8,v8,ks,vs,split=s).float()-ref).abs().max().item())
from tideserve.worker.backends.torch_whisper.model import Whisper, WhisperDims, KVCache
dims=WhisperDims.large_v3(); torch.manual_seed(0)
with torch.device("cuda"): m=Whisper(dims)
m=m.to(torch.bfloat16).eval(); enc=torch.randn(8,1500,1280,device="cuda",dtype=torch.bfloat16)
out={}
with torch.inference_mode():
  for name,fp8,att in (("sdpa",False,"sdpa"),("triton",False,"triton"),("triton_fp8",True,"triton")):
    if att=="triton": m.fuse_qkv()
    m.attention=att; c=KVCache(dims,8,torch.bfloat16,torch.device("cuda"),cross_fp8=fp8); m.fill_cross(c,enc)
    out[name]=torch.stack([m.step(c,torch.full((8,),50257+i,device="cuda"),torch.full((8,),i,device="cuda"),128) for i in range(5)])
for k in ("triton","triton_fp8"): print(k,"logit diff vs sdpa",(out[k]-out["sdpa"]).abs().max().item(),"of",out["sdpa"].abs().max().item(),"argmax agree",(out[k].argmax(-1)==out["sdpa"].argmax(-1)).float().mean().item())
PY
echo "== step parts, fp8"
timeout 150 python3 bench/gpu_step_parts.py --only-fp8 --batch-sizes 64,128 --json $OUT/step_parts_fp8.json 2>&1 | grep -v Warn
echo "== accuracy bf16"
timeout 150 python3 bench/accuracy_gpu.py run .devdata/tiny-en $OUT/acc_gpu.json --minutes 1,5,20 --spaced 3:41,3:42,3:43,3:44,5:45,5:46 2>&1 | tail -3
echo "== accuracy: fp8 cross kv, triton self-attention"
timeout 120 python3 bench/accuracy_gpu.py run .devdata/tiny-en $OUT/acc_gpu_fp8.json --minutes 1,5,20 --spaced 3:41,3:42,3:43,3:44,5:45,5:46 --cross-fp8 --attention triton 2>&1 | tail -3
echo "== large-v3 engine alone: bf16, fp8 cross, fp8 + triton self-attention"
python3 bench/make_whisper_dir.py --size large-v3 --vocab-size 51864 --tokenizer /tmp/tiny-en/tokenizer.json --out /tmp/large-v3-random >/dev/null
timeout 200 python3 bench/gpu_e2e.py --model-dir /tmp/large-v3-random --clips .devdata/clips --out "$OUT" --fixed-tokens 100 --requests 800 --skip served,engine,hf,pipeline,hol --engine-sweep 64x16,64x16:fp8,64x16:fp8:triton,128x16:fp8:triton 2>&1 | grep -v "^\[transformers\]\|Warning\|warn("
echo "== torch backend tests on the GPU"
timeout 90 python3 -m pytest -q --noconftest -p no:cacheprovider tests/unit/worker/test_torch_backend.py tests/unit/worker/test_continuous_batching.py 2>&1 | tail -3
