"""Two candidate savings in the large-v3 encoder, measured on the GPU (random weights of the real
shapes, bf16), milliseconds per 30-s window:

- ``compiled``: the encoder as served (``model.compile_batch_dynamic(model.encode)``, the batch
  dimension dynamic), where Inductor runs each layer's GELU as a kernel of its own after cuBLAS's
  fc1 product: on an H100 (2026-12-07, ``gpu_e2e.py --profile-requests 600``) that GELU kernel
  took 0.54 ms a window under the profiler (the encoder: 5.52 ms a window in the engine), reading and writing the [1500, 5120] activations.
- ``compiled_gelu_epilogue``: the same with fc1 and its GELU in one cuBLASLt call
  (``Whisper.fuse_encoder_gelu``: ``model.linear_gelu``, ``torch._addmm_activation(...,
  use_gelu=True)``, the GELU in the product's epilogue; cuBLASLt's GELU is the tanh approximation,
  Whisper's the exact erf one), a custom operator that Inductor keeps whole. (The first run, of
  2026-12-07, had its own copy of that operator and of the layer's forward.) Reported with its
  output's largest difference from ``compiled`` and their cosine similarity (random weights: a
  check of the arithmetic, not of accuracy on speech).
- ``attention_<backend>``: the encoder's 32 self-attentions alone, eager, with each of PyTorch's
  attention backends forced (``torch.nn.attention.sdpa_kernel``); PyTorch picks cuDNN's on an H100.

Median of 10 timed passes after 2 warm-up passes (CUDA events, ``gpu_encoder_parts.per_window_ms``).

    python3 bench/gpu_encoder_gelu.py --json $OUT/encoder_gelu.json [--batches 62,32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tideserve.worker.backends.torch_whisper import model as wm
from gpu_encoder_parts import per_window_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--batches", default="62,32")
    a = ap.parse_args()
    batches = [int(x) for x in a.batches.split(",")]
    dims = wm.WhisperDims.large_v3()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = wm.Whisper(dims)
    model = model.to(torch.bfloat16).eval()
    res: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    feats = {b: torch.randn(b, dims.num_mel_bins, 3000, device="cuda", dtype=torch.bfloat16) for b in batches}
    outs: dict = {}
    for name, fused in (("compiled", False), ("compiled_gelu_epilogue", True)):
        model.fuse_encoder_gelu(fused)
        torch._dynamo.reset()
        t0 = time.perf_counter()
        enc = wm.compile_batch_dynamic(model.encode, max(batches))
        with torch.inference_mode():
            enc(feats[batches[0]])
            compile_s = time.perf_counter() - t0
            for b in batches:
                outs[name, b] = enc(feats[b]).float()
                ms = per_window_ms(lambda b=b, enc=enc: enc(feats[b]), b)
                row = {"variant": name, "batch": b, "ms_per_window": round(ms, 3), "compile_s": round(compile_s, 1)}
                if name != "compiled":
                    ref, got = outs["compiled", b], outs[name, b]
                    row["max_abs_diff"] = (got - ref).abs().max().item()
                    row["cosine"] = F.cosine_similarity(got.flatten(), ref.flatten(), dim=0).item()
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
    model.fuse_encoder_gelu(False)
    heads, hd = dims.encoder_attention_heads, dims.d_model // dims.encoder_attention_heads
    for b in batches:
        q, k, v = (torch.randn(b, heads, 1500, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            try:
                with sdpa_kernel(backend):
                    ms = per_window_ms(lambda q=q, k=k, v=v: [F.scaled_dot_product_attention(q, k, v)
                                                             for _ in range(dims.encoder_layers)], b)
                row = {"variant": f"attention_{backend.name.lower()}", "batch": b, "ms_per_window": round(ms, 3)}
            except RuntimeError as exc:
                row = {"variant": f"attention_{backend.name.lower()}", "batch": b, "failed": str(exc)[:120]}
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
    a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
