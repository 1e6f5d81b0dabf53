"""The decoder step's matrix products at large-v3 shapes, bf16 against FP8 (issue 12: what FP8
weights could take off a step). Per step and row count, milliseconds of the 32 layers' products
as the compiled step runs them (one fused q/k/v, the self-attention output, the cross-attention
query and output, fc1, fc2) plus the vocabulary projection, each variant replayed from one CUDA
graph (``gpu_step_parts.graph_ms``; no launch cost counted, as in the served step):

- ``bf16``: ``F.linear`` on bf16 weights (today's step);
- ``fp8_rowwise``: E4M3 weights with a scale per output channel, the activations quantized per
  row on the fly (absolute maximum to 448) in eager PyTorch, ``torch._scaled_mm`` into bf16;
- ``fp8_rowwise_compiled``: the same through ``torch.compile`` (the quantization fused);
- the bytes of weights each variant reads per step and the bandwidth that implies.

Random weights of the real shapes: a measure of time, not of accuracy.

    python3 bench/gpu_step_gemm_fp8.py --json $OUT/step_gemm_fp8.json [--rows 64,128]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_step_parts import graph_ms

E4M3_MAX = 448.0
D, FFN, VOCAB, LAYERS = 1280, 5120, 51866, 32


def shapes() -> list[tuple[int, int]]:
    """(out, in) of every product of one step, in order."""
    per_layer = [(3 * D, D), (D, D), (D, D), (D, D), (FFN, D), (D, FFN)]
    return per_layer * LAYERS + [(VOCAB, D)]


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` bf16 -> (E4M3 ``[N', K]``, float32 scale ``[1, N']``), N' = N rounded up to a
    multiple of 16 (``torch._scaled_mm``'s rule; the vocabulary's 51,866 rows are padded with zeros)."""
    pad = -w.shape[0] % 16
    if pad:
        w = torch.cat([w, w.new_zeros(pad, w.shape[1])])
    s = w.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (w.float() / s).to(torch.float8_e4m3fn), s.t().contiguous()


def fp8_linear(x: torch.Tensor, w8: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    xs = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
    x8 = (x / xs).to(torch.float8_e4m3fn)
    return torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)


def measure(m: int, weights: list[torch.Tensor], q8: list[tuple[torch.Tensor, torch.Tensor]], compiled_one,
            bf16_bytes: int, fp8_bytes: int) -> dict:
    """One row count's milliseconds and bandwidth per variant, and FP8's relative error."""
    xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in (D, FFN)}

    def bf16() -> None:
        for w in weights:
            F.linear(xs[w.shape[1]], w)

    def fp8() -> None:
        for w8, s in q8:
            fp8_linear(xs[w8.shape[1]], w8, s)

    def fp8_compiled() -> None:
        for w8, s in q8:
            compiled_one(xs[w8.shape[1]], w8, s)

    row: dict = {"rows": m}
    with torch.inference_mode():
        for name, fn, nbytes in (("bf16", bf16, bf16_bytes), ("fp8_rowwise", fp8, fp8_bytes),
                                 ("fp8_rowwise_compiled", fp8_compiled, fp8_bytes)):
            ms = graph_ms(fn)
            row[f"{name}_ms"] = round(ms, 3)
            row[f"{name}_tb_s"] = round(nbytes / (ms / 1e3) / 1e12, 2)
        ref = F.linear(xs[D], weights[1]).float()
        got = fp8_linear(xs[D], *q8[1]).float()
        row["fp8_rel_err"] = round(((got - ref).norm() / ref.norm()).item(), 4)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--rows", default="64,128")
    a = ap.parse_args()
    torch.manual_seed(0)
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for n, k in shapes()]
    q8 = [quantize_weight(w) for w in weights]
    bf16_bytes = sum(w.numel() * 2 for w in weights)
    fp8_bytes = sum(w.numel() for w in weights)
    compiled_one = torch.compile(fp8_linear)
    out = [measure(int(r), weights, q8, compiled_one, bf16_bytes, fp8_bytes) for r in a.rows.split(",")]
    Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "weights_gb_bf16": bf16_bytes / 1e9, "rows": out}, indent=1))


if __name__ == "__main__":
    main()
