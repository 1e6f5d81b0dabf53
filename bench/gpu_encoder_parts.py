"""Where the large-v3 encoder's time goes on the GPU, and what a faster encoder could give:
milliseconds per 30-s window (random weights of the real shapes, bf16) for

- ``eager``: ``Whisper.encode`` as served today;
- ``linear_only`` / ``attention_only``: the 32 layers' matrix products alone (q, k, v, out,
  fc1, fc2) and their attention (``scaled_dot_product_attention`` over 1500 positions) alone;
- ``compiled``: ``torch.compile(encode, dynamic=False)`` (one compilation per batch size;
  its seconds are reported);
- ``fp8_linear``: every encoder matrix product in FP8 (E4M3 weights with a scale per output
  channel, activations quantized per row on the fly, ``torch._scaled_mm``), eager, and its
  output's cosine similarity with bf16's (random weights: a check of the arithmetic, not of
  accuracy on speech);
- ``fp8_compiled``: the same FP8 products under ``torch.compile(encode, dynamic=False)`` at the
  largest batch, where Inductor can fuse each activation's quantization (absolute maximum per row,
  divide, cast) into the layer norm or GELU before it.

Median of 10 timed passes after 2 warm-up passes, CUDA events (``gpu_step_parts.eager_ms``).
Writes a JSON list of rows.

    python3 bench/gpu_encoder_parts.py --json $OUT/encoder_parts.json [--batches 16,32] [--no-compile]
    python3 bench/gpu_encoder_parts.py --profile 16   # the kernels of one eager pass, by GPU time
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tideserve.worker.backends.torch_whisper.model import EncoderLayer, Whisper, WhisperDims
from gpu_step_parts import eager_ms

E4M3_MAX = 448.0


def per_window_ms(fn, batch: int) -> float:
    """Median milliseconds of ``fn`` (10 timed passes, CUDA events) over its ``batch`` windows."""
    return eager_ms(fn, repeats=10) / batch


class Fp8Linear(torch.nn.Module):
    """``y = x W^T + b`` with W as E4M3 and a float32 scale per output channel; x quantized per
    row (its absolute maximum maps to 448) before ``torch._scaled_mm``."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        w = lin.weight.detach().float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX  # [N, 1]
        self.w8 = (w / scale).to(torch.float8_e4m3fn)  # [N, K]
        self.w_scale = scale.t().contiguous()  # [1, N]
        self.bias = None if lin.bias is None else lin.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        xs = x2.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX  # [M, 1]
        x8 = (x2 / xs).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(x8, self.w8.t(), scale_a=xs, scale_b=self.w_scale, out_dtype=torch.bfloat16)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], -1)


def to_fp8(model: Whisper) -> None:
    for layer in model.encoder.layers:
        assert isinstance(layer, EncoderLayer)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(layer.self_attn, name, Fp8Linear(getattr(layer.self_attn, name)))
        layer.fc1, layer.fc2 = Fp8Linear(layer.fc1), Fp8Linear(layer.fc2)


def bf16_row(model: Whisper, dims: WhisperDims, batch: int, compile_it: bool) -> dict:
    """The bf16 measurements at one encoder batch size."""
    d, heads, ffn = dims.d_model, dims.encoder_attention_heads, dims.encoder_ffn_dim
    feats = torch.randn(batch, dims.num_mel_bins, 3000, device="cuda", dtype=torch.bfloat16)
    row: dict = {"batch": batch, "eager_ms": per_window_ms(partial(model.encode, feats), batch)}
    x = torch.randn(batch, 1500, d, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(batch, 1500, ffn, device="cuda", dtype=torch.bfloat16)
    w_d = torch.randn(d, d, device="cuda", dtype=torch.bfloat16)
    w_up = torch.randn(ffn, d, device="cuda", dtype=torch.bfloat16)
    w_down = torch.randn(d, ffn, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch, heads, 1500, d // heads, device="cuda", dtype=torch.bfloat16)

    def linears() -> None:
        for _ in range(dims.encoder_layers):
            for _ in range(4):
                F.linear(x, w_d)
            F.linear(x, w_up)
            F.linear(h, w_down)

    def attention() -> None:
        for _ in range(dims.encoder_layers):
            F.scaled_dot_product_attention(q, q, q)
    row["linear_only_ms"] = per_window_ms(linears, batch)
    row["attention_only_ms"] = per_window_ms(attention, batch)
    flops = 2 * 1500 * dims.encoder_layers * (4 * d * d + 2 * d * ffn)
    row["linear_tflops"] = flops / (row["linear_only_ms"] / 1e3) / 1e12
    if compile_it:
        t0 = time.perf_counter()
        compiled = torch.compile(model.encode, dynamic=False)
        compiled(feats)
        torch.cuda.synchronize()
        row["compile_s"] = time.perf_counter() - t0
        row["compiled_ms"] = per_window_ms(partial(compiled, feats), batch)
    return row


def profile(model: Whisper, dims: WhisperDims, batch: int) -> None:
    feats = torch.randn(batch, dims.num_mel_bins, 3000, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        for _ in range(3):
            model.encode(feats)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            model.encode(feats)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=90))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--batches", default="16,32")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--profile", type=int, default=0, metavar="BATCH",
                    help="print the CUDA kernels of one eager pass at this batch, by total time, and stop")
    args = ap.parse_args()
    torch.manual_seed(0)
    dims = WhisperDims.large_v3()
    with torch.device("cuda"):
        model = Whisper(dims)
    model = model.to(torch.bfloat16).eval()
    if args.profile:
        profile(model, dims, args.profile)
        return
    batches = [int(b) for b in args.batches.split(",")]
    rows: list[dict] = []
    with torch.inference_mode():
        for batch in batches:
            rows.append(bf16_row(model, dims, batch, compile_it=not args.no_compile and batch == max(batches)))
            print(json.dumps(rows[-1]), flush=True)
        to_fp8(model)
        for row in rows:
            feats = torch.randn(row["batch"], dims.num_mel_bins, 3000, device="cuda", dtype=torch.bfloat16)
            row["fp8_linear_ms"] = per_window_ms(partial(model.encode, feats), row["batch"])
            print(json.dumps({"batch": row["batch"], "fp8_linear_ms": row["fp8_linear_ms"]}), flush=True)
            if not args.no_compile and row["batch"] == max(batches):
                t0 = time.perf_counter()
                compiled = torch.compile(model.encode, dynamic=False)
                compiled(feats)
                torch.cuda.synchronize()
                row["fp8_compile_s"] = time.perf_counter() - t0
                row["fp8_compiled_ms"] = per_window_ms(partial(compiled, feats), row["batch"])
                print(json.dumps({"batch": row["batch"], "fp8_compiled_ms": row["fp8_compiled_ms"]}), flush=True)
        torch.manual_seed(1)
        feats = torch.randn(4, dims.num_mel_bins, 3000, device="cuda", dtype=torch.bfloat16)
        torch.manual_seed(0)
        with torch.device("cuda"):
            bf = Whisper(dims)
        bf = bf.to(torch.bfloat16).eval()
        a = bf.encode(feats).float()
        to_fp8(bf)
        b = bf.encode(feats).float()
        cos = F.cosine_similarity(a.flatten(1), b.flatten(1)).min().item()
        rows.append({"fp8_vs_bf16_cosine_min": cos})
        print(json.dumps(rows[-1]))
    Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                           "dims": "large-v3", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
