"""Would Inductor's GEMM autotuning make large-v3's served step and encoder faster? One run,
CUDA events, the torch backend's own model and decoder (random weights of the real shapes, bf16,
FP8 cross keys and values, Triton attention; timing only).

Variants, each compiled afresh (``torch._dynamo.reset``) with the batch dimension dynamic as the
backend compiles it (``model.compile_batch_dynamic``), first called with ``--batch`` rows so that
Inductor's size hint is the saturated batch:
- ``default``: the model's step compiled alone, the logit rules eager (as served before
  2026-12-06; large-v3 only, tiny's step eager), Inductor with cuBLAS for every matrix product;
- ``autotune``: as ``default`` with ``max_autotune`` and ``ATEN,TRITON`` GEMM backends: each
  matrix product is benchmarked against Triton templates, which can also take the bias, GELU or
  residual add into their epilogue;
- ``whole``: the whole step compiled, the logit rules and state update with the model's step,
  as served since (``GreedyDecoder(compile_step=True)``, batch dimension dynamic). The committed
  ``rules`` rows of ``bench/results/gpu_step_compile_h100.json`` came from this script at a5eda9c,
  which compiled the decoder's old ``_step`` for a static batch of 64 instead (``whole`` on an H100,
  2026-12-06: 5.46 ms, ``bench/results/gpu_fp8_products_h100.json``);
- ``whole-fp8w``: as ``whole``, on the same random model built again with its layers' matrix products in FP8
  (``bench/fp8_linear.py``'s ``quantize_fp8``), the encoder's included.
For each: ms per decoder step of a full batch (CUDA graph replays, as served; rows from position
0, ``--steps`` steps), ms per window of the encoder at ``--batch`` windows, and compile seconds.

    python3 bench/gpu_autotune.py --json $OUT/autotune.json [--variants default,whole] [--size tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tideserve.worker.backends.torch_whisper.decode import GreedyDecoder
from tideserve.worker.backends.torch_whisper.model import Whisper, WhisperDims, compile_batch_dynamic
from fp8_linear import quantize_fp8
from gpu_overlap import timed
from gpu_whisper import special_for


class _StepOnly:
    """``model`` with its ``step`` replaced by ``step`` (what the decoder's eager step calls)."""

    def __init__(self, model: Whisper, step) -> None:
        self._model, self.step = model, step

    def __getattr__(self, name: str):
        return getattr(self._model, name)


def variant(name: str, model: Whisper, batch: int, steps: int, repeats: int) -> dict:
    import torch._inductor.config as ic

    torch._dynamo.reset()
    ic.max_autotune = name == "autotune"
    ic.max_autotune_gemm_backends = "ATEN,TRITON" if name == "autotune" else "ATEN"
    dims = model.dims
    special = special_for(dims.vocab_size)
    large = dims.d_model == 1280
    out: dict = {"variant": name, "size": "large-v3" if large else f"d_model {dims.d_model}",
                 "batch": batch, "steps": steps}
    full = torch.randn(batch, dims.num_mel_bins, 3000, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        t0 = time.perf_counter()
        encode = compile_batch_dynamic(model.encode, batch)
        encoded = encode(full)
        torch.cuda.synchronize()
        out["encoder_compile_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        whole = name.startswith("whole")
        dec = GreedyDecoder(model, special, max_batch=batch, cross_fp8=large, compile_step=whole)
        if not whole and large:  # the model's step alone compiled, called by the eager step
            step = compile_batch_dynamic(model.step, batch)
            zeros = [torch.zeros(batch, dtype=torch.long, device="cuda") for _ in range(2)]
            step(dec.cache, zeros[0], zeros[1], dims.max_target_positions)
            dec.model = _StepOnly(model, step)  # type: ignore[assignment]
        torch.cuda.synchronize()
        out["step_compile_s"] = round(time.perf_counter() - t0, 1)
        prompt = [special.sot, special.no_timestamps]

        def fresh() -> None:
            dec.release(list(dec.busy_slots))
            dec.admit(encoded, [prompt] * batch, [False] * batch, max_new_tokens=440, min_new_tokens=440)

        fresh()
        dec.run(4)
        steps_s, enc_s = [], []
        for _ in range(repeats):
            fresh()
            steps_s.append(timed(lambda: dec.run(steps)))
            enc_s.append(timed(lambda: encode(full)))
    out["ms_per_step"] = round(1000 * sorted(steps_s)[repeats // 2] / steps, 3)
    out["encoder_ms_per_window"] = round(1000 * sorted(enc_s)[repeats // 2] / batch, 3)
    # a window's device time at a fixed 100 tokens: one encoder pass and 100 steps shared by the batch
    out["ms_per_window_100_tokens"] = round(out["encoder_ms_per_window"] + 100 * out["ms_per_step"] / batch, 3)
    out["device"] = torch.cuda.get_device_name(0)
    print(json.dumps(out), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="default,autotune")
    ap.add_argument("--size", default="large-v3", choices=("large-v3", "tiny"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    def build(fp8_weights: bool) -> Whisper:
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = Whisper(WhisperDims.large_v3() if a.size == "large-v3" else WhisperDims.tiny())
        model = model.to(torch.bfloat16).eval()
        if a.size == "large-v3":  # as served (tiny: bf16 keys and values, PyTorch's attention, eager step)
            model.fuse_qkv()
            model.attention = "triton"
        if fp8_weights:
            quantize_fp8(model)
        return model

    rows = []
    for v in a.variants.split(","):
        model = build(v.endswith("-fp8w"))
        rows.append(variant(v, model, a.batch, a.steps, a.repeats))
        del model
        torch.cuda.empty_cache()
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
