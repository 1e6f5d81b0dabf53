"""The decoder step's matrix products at large-v3 shapes under PyTorch's BLAS choices: does another
cuBLAS path read the step's weights faster than the one PyTorch takes? On an H100 the compiled
step's 193 products (32 layers' fused q/k/v, self-attention output, cross-attention query and
output, fc1, fc2, each with its bias, and the vocabulary projection, without one) took about 1.34
ms a step at 64 rows under the profiler, reading 1.6 GB of weights at about 1.2 TB/s, about a third
of the card's bandwidth
(``bench/results/gpu_engine_kernels_large_v3_h100_600.txt``): small products bound by their
latency, not by bytes.

Each variant is the same list of ``F.linear`` calls (bias where the model has one), replayed from
one CUDA graph (``gpu_step_parts.graph_ms``), milliseconds a step per row count:

- ``default``: as PyTorch runs them (cuBLASLt for a product with a bias on an H100);
- ``split_bias``: the product without its bias (``torch.mm``, cuBLAS's own heuristics) and the
  bias added after it, as a kernel of its own.

Run it once per BLAS setting in fresh processes, e.g. ``DISABLE_ADDMM_CUDA_LT=1`` (PyTorch's
switch off cuBLASLt for products with a bias) or ``TORCH_BLAS_PREFER_CUBLASLT=0``; each row
records the setting it ran under.

    python3 bench/gpu_step_blas.py --json $OUT/step_blas_default.json [--rows 64,128]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_step_parts import graph_ms

D, FFN, VOCAB, LAYERS = 1280, 5120, 51866, 32
ENV = ("DISABLE_ADDMM_CUDA_LT", "TORCH_BLAS_PREFER_CUBLASLT")


def products() -> list[tuple[int, int, bool]]:
    """(out, in, has bias) of every product of one step, in order."""
    per_layer = [(3 * D, D, True), (D, D, True), (D, D, True), (D, D, True), (FFN, D, True), (D, FFN, True)]
    return per_layer * LAYERS + [(VOCAB, D, False)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--rows", default="64,128")
    a = ap.parse_args()
    torch.manual_seed(0)
    weights = [(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02,
                torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None) for n, k, bias in products()]
    gbytes = sum(w.numel() * 2 for w, _ in weights) / 1e9
    rows = []
    for m in (int(x) for x in a.rows.split(",")):
        xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in (D, FFN)}

        def default(xs=xs) -> None:
            for w, b in weights:
                F.linear(xs[w.shape[1]], w, b)

        def split_bias(xs=xs) -> None:
            for w, b in weights:
                y = xs[w.shape[1]] @ w.t()
                if b is not None:
                    y += b

        row = {"rows": m, "setting": {k: os.environ.get(k) for k in ENV}, "weights_GB": round(gbytes, 3)}
        for name, fn in (("default", default), ("split_bias", split_bias)):
            ms = graph_ms(fn)
            row[f"{name}_ms"] = round(ms, 3)
            row[f"{name}_TBps"] = round(gbytes / ms, 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                  "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
