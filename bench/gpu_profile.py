"""Where a decode step's time goes on the GPU (large-v3 shapes, random weights): the encoder
alone, the decode alone per attention implementation, with and without torch.compile of the
step, and the top kernels of a few eager steps. A tuning aid; bench/gpu_whisper.py is the
benchmark of record.

    python bench/gpu_profile.py --batch 32
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tideserve.worker.backends.torch_whisper.decode import GreedyDecoder
from tideserve.worker.backends.torch_whisper.model import KVCache, Whisper, WhisperDims

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_whisper import special_for


def sync_time(fn, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    dims = WhisperDims.large_v3()
    special = special_for(dims.vocab_size)
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = Whisper(dims)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02)
    model = model.to(torch.bfloat16).eval()
    b = a.batch
    feats = torch.randn(b, dims.num_mel_bins, 3000, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        enc_s = sync_time(lambda: model.encode(feats), 5)
        print(f"encoder bs{b}: {enc_s * 1000:.1f} ms", flush=True)
        enc = model.encode(feats)
        prompts = [[special.sot, special.no_timestamps]] * b
        for impl in ("sdpa", "matmul"):
            model.attention = impl
            dec = GreedyDecoder(model, special, max_batch=b)
            run = functools.partial(dec.decode, enc, prompts, [False] * b, max_new_tokens=a.tokens,
                                    min_new_tokens=a.tokens)
            run()
            s = sync_time(run, 3)
            print(f"decode {a.tokens} tokens bs{b} attention={impl} graphs: {s * 1000:.1f} ms "
                  f"({s / a.tokens * 1000:.2f} ms/step)", flush=True)
            del run, dec  # frees this decoder's CUDA graphs before the next one captures its own
        model.attention = "matmul"
        cache = KVCache(dims, b, torch.bfloat16, torch.device("cuda"))
        model.fill_cross(cache, enc)
        tok = torch.full((b,), special.sot, device="cuda")
        pos = torch.zeros(b, dtype=torch.long, device="cuda")
        for impl in ("sdpa", "matmul"):
            model.attention = impl
            step_s = sync_time(lambda: model.step(cache, tok, pos, 128), 10)
            print(f"eager model.step bs{b} {impl}: {step_s * 1000:.2f} ms", flush=True)
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    model.step(cache, tok, pos, 128)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12), flush=True)
        if a.compile:
            model.attention = "matmul"
            compiled = torch.compile(model.step, dynamic=False, fullgraph=True)
            t0 = time.perf_counter()
            compiled(cache, tok, pos, 128)
            torch.cuda.synchronize()
            print(f"compile: {time.perf_counter() - t0:.1f} s", flush=True)
            s = sync_time(lambda: compiled(cache, tok, pos, 128), 10)
            print(f"compiled model.step bs{b}: {s * 1000:.2f} ms (eager, no graph)", flush=True)
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                compiled(cache, tok, pos, 128)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(g):
                compiled(cache, tok, pos, 128)
            s = sync_time(g.replay, 20)
            print(f"compiled model.step bs{b} in a CUDA graph: {s * 1000:.2f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
