"""Derive Whisper large-v3 service-time profiles for A10G (g5) and L40S (g6e) from H200 measurements.

Nothing here is measured on an A10G or an L40S: the profile is marked ``measured: false`` and says
in ``derived_from`` how it was made, so that the simulator accepts it (tideserve.sim.profile).

Rule. One execution of B windows of a seconds = encoder(B) + tokens(a) x decode_step(B):

- encoder(B): measured on the lent H200 for large-v3 sizes (32+32 layers, d_model 1280, 128 mel
  bins, bf16, sdpa): 23.5 / 210.5 / 417.8 ms per batch of 1 / 32 / 64 windows of 30 s (Whisper
  always encodes a 30 s window), linear in between. The encoder is compute-bound, so on GPU g it
  takes H200 x (989 / dense FP16 tensor TFLOPS of g): A10G 125 (NVIDIA's A10 figure), L40S 362
  (NVIDIA datasheets; H200 989).
- decode_step(B): memory-bound. Each step reads the decoder's weights (about 0.9 B parameters,
  1.8 GB in fp16) and, per row, the cross-attention keys and values over 1500 encoder positions
  (32 layers x 2 x 1500 x 1280 x 2 bytes = 246 MB); at 67% of the GPU's memory bandwidth
  (A10G 600 GB/s, L40S 864 GB/s, NVIDIA datasheets), plus a 1 ms floor per step (kernel launches
  under CUDA graphs, sampling). The H200 measurement of Hugging Face ``generate`` (55 ms per step,
  launch-bound) is not used: tideserve's torch backend replays CUDA graphs.
- tokens(a) = 4 + 3 a (about 3 text tokens per second of speech plus the prompt and timestamps).

Run: ``python bench/derive_profiles.py`` (writes bench/profiles/derived-large-v3-a10g-l40s.json).
"""

from __future__ import annotations

import json
from pathlib import Path
import itertools

ENC_H200_S = {1: 0.0235, 32: 0.2105, 64: 0.4178}
H200_TFLOPS = 989.0
GPUS = {  # pool, target, accelerator, dense FP16 TFLOPS, memory bandwidth bytes/s
    "a10g": ("cuda-sm86-fp16", 125.0, 600e9),
    "l40s": ("cuda-sm89-fp16", 362.0, 864e9),
}
DECODER_BYTES = 1.8e9
KV_BYTES_PER_ROW = 32 * 2 * 1500 * 1280 * 2
BW_EFFICIENCY = 0.67
STEP_FLOOR_S = 0.001
BATCHES = (1, 2, 4, 8, 16, 32)
LENGTHS = (5.0, 15.0, 30.0)


def encoder_h200(b: int) -> float:
    pts = sorted(ENC_H200_S.items())
    for (b0, t0), (b1, t1) in itertools.pairwise(pts):
        if b <= b1:
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    return pts[-1][1] * b / pts[-1][0]


def service_s(gpu: str, b: int, audio_s: float) -> float:
    _, tflops, bw = GPUS[gpu]
    enc = encoder_h200(b) * H200_TFLOPS / tflops
    step = STEP_FLOOR_S + (DECODER_BYTES + b * KV_BYTES_PER_ROW) / (bw * BW_EFFICIENCY)
    return enc + (4 + 3 * audio_s) * step


def main() -> None:
    doc = {
        "format": "tideserve.profile/v1",
        "metadata": {
            "machine": "derived (no A10G or L40S was measured)", "cpu": "", "cpus": 0, "gpu": "A10G / L40S (derived)",
            "date": "2026-12-02T00:00:00+00:00", "model": "whisper-large-v3",
            "model_source": "s3://tideserve-models/whisper/large-v3", "backend": "torch", "backend_version": "",
            "decoding": {"beam_size": 1, "without_timestamps": False}, "repeats": 1, "measured": False,
            "derived_from": "bench/derive_profiles.py: H200 large-v3 encoder measurements (23.5/210.5/417.8 ms at "
                            "batch 1/32/64) scaled by dense FP16 TFLOPS (989 -> A10G 125, L40S 362); decode steps "
                            "memory-bound from weight and cross-attention bytes at 67% of each GPU's bandwidth "
                            "(600 / 864 GB/s) + 1 ms; tokens = 4 + 3 per audio second",
            "load_average_1m": [], "notes": "an estimate for the simulator; replace with `tideserve bench profile` "
                                            "runs on g5/g6e machines",
        },
        "pools": [
            {"pool": gpu, "target": target, "accelerator": gpu,
             "points": [{"batch_size": b, "audio_s": a, "latency_s": round(service_s(gpu, b, a), 5), "samples_s": []}
                        for b in BATCHES for a in LENGTHS]}
            for gpu, (target, _, _) in GPUS.items()
        ],
    }
    out = Path(__file__).parent / "profiles" / "derived-large-v3-a10g-l40s.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for gpu in GPUS:
        print(gpu, " ".join(f"b{b}/a{a:g}={service_s(gpu, b, a):.2f}s" for b in (1, 16) for a in LENGTHS))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
