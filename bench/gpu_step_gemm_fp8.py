"""The decoder step's matrix products at large-v3 shapes, bf16 against FP8 (issue 12: what FP8
weights could take off a step). Per step and row count, milliseconds of the 32 layers' products
as the compiled step runs them (one fused q/k/v, the self-attention output, the cross-attention
query and output, fc1, fc2) plus the vocabulary projection, each variant replayed from one CUDA
graph (``gpu_step_parts.graph_ms``; no launch cost counted, as in the served step):

- ``bf16``: ``F.linear`` on bf16 weights (today's step);
- ``fp8_rowwise``: ``fp8_linear.Fp8Linear`` (E4M3 weights with a scale per output channel, the
  activations quantized per row on the fly in eager PyTorch, ``torch._scaled_mm`` into bf16);
- ``fp8_rowwise_compiled``: the same through ``torch.compile`` (the quantization fused);
- the bytes of weights each variant reads per step and the bandwidth that implies.

Random weights of the real shapes: a measure of time, not of accuracy.
``bench/results/gpu_step_gemm_fp8_h100.json`` was measured by this script's first version, which
had its own copy of the same scheme (the input divided by its scale in bf16 rather than float32);
not re-run since it takes ``Fp8Linear``.

    python3 bench/gpu_step_gemm_fp8.py --json $OUT/step_gemm_fp8.json [--rows 64,128]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_linear import Fp8Linear
from gpu_step_parts import graph_ms

D, FFN, VOCAB, LAYERS = 1280, 5120, 51866, 32


def shapes() -> list[tuple[int, int]]:
    """(out, in) of every product of one step, in order."""
    per_layer = [(3 * D, D), (D, D), (D, D), (D, D), (FFN, D), (D, FFN)]
    return per_layer * LAYERS + [(VOCAB, D)]


def fp8_of(w: torch.Tensor) -> Fp8Linear:
    """``Fp8Linear`` over the weight ``w`` ``[N, K]`` (no bias), N padded with zero rows to a
    multiple of 16 (``torch._scaled_mm``'s rule; the vocabulary's 51,866 rows)."""
    pad = -w.shape[0] % 16
    lin = torch.nn.Linear(w.shape[1], w.shape[0] + pad, bias=False, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.cat([w, w.new_zeros(pad, w.shape[1])]) if pad else w)
    return Fp8Linear(lin)


def measure(m: int, weights: list[torch.Tensor], q8: list[Fp8Linear], compiled: list, bf16_bytes: int,
            fp8_bytes: int) -> dict:
    """One row count's milliseconds and bandwidth per variant, and FP8's relative error."""
    xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in (D, FFN)}

    def bf16() -> None:
        for w in weights:
            F.linear(xs[w.shape[1]], w)

    def fp8() -> None:
        for lin in q8:
            lin(xs[lin.in_features])

    def fp8_compiled() -> None:
        for lin, fn in zip(q8, compiled, strict=True):
            fn(xs[lin.in_features])

    row: dict = {"rows": m}
    with torch.inference_mode():
        for name, fn, nbytes in (("bf16", bf16, bf16_bytes), ("fp8_rowwise", fp8, fp8_bytes),
                                 ("fp8_rowwise_compiled", fp8_compiled, fp8_bytes)):
            ms = graph_ms(fn)
            row[f"{name}_ms"] = round(ms, 3)
            row[f"{name}_tb_s"] = round(nbytes / (ms / 1e3) / 1e12, 2)
        ref = F.linear(xs[D], weights[1]).float()
        got = q8[1](xs[D]).float()
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
    q8 = [fp8_of(w) for w in weights]
    bf16_bytes = sum(w.numel() * 2 for w in weights)
    fp8_bytes = sum(lin.weight.numel() for lin in q8)
    forward = torch.compile(Fp8Linear.forward)  # one compiled function, recompiled per shape
    compiled = [functools.partial(forward, lin) for lin in q8]
    out = [measure(int(r), weights, q8, compiled, bf16_bytes, fp8_bytes) for r in a.rows.split(",")]
    Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "weights_gb_bf16": bf16_bytes / 1e9, "rows": out}, indent=1))


if __name__ == "__main__":
    main()
