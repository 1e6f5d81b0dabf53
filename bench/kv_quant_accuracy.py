"""Word error rate of tiny.en with its cross-attention keys and values rounded to fewer bits, on
the CPU (issue 12's question: would 4-bit keys and values keep the transcripts?).

At large-v3 size a decoder step reads every window's cross-attention keys and values (1,500
positions x 1,280 values x 32 layers, twice); in FP8 that read is about half of the step
(README, Serving path (10)), so 4 bits would take about a quarter off the step. This measures
what the rounding alone does to the text: the torch backend on the CPU (fp32) with the keys and
values quantized and dequantized as each window's cross-attention cache is filled
(``Whisper.fill_cross`` patched; the attention itself unchanged), over every shipped English
clip and the long files of bench/accuracy.py (1, 5 and 20 minutes, seeds 13-15), greedy, with
timestamps (verbose_json), as ``bench/accuracy.py --beam 1 --systems tideserve-torch`` runs it.

Schemes (symmetric, round to nearest):
- ``fp32``: none (the reference);
- ``fp8-row-head``: E4M3 with one scale per window and head, the served GPU scheme
  (``triton_kernels.quantize``);
- ``int4-row-head``: 4 bits (-7..7) with one scale per window and head;
- ``int4-token-head``: 4 bits with one scale per window, head and position (64 values), the
  scale in fp16 (1/16 more bytes).

    .venv/bin/python bench/kv_quant_accuracy.py --json bench/results/kv_quant_accuracy_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for _p in ("tests", "bench", "src"):
    sys.path.insert(0, str(ROOT / _p))

import audio  # noqa: E402
from inproc import REQUEST_KINDS, Tideserve  # noqa: E402
from longfiles import long_files  # noqa: E402
from tideserve.spec.models import Decoding  # noqa: E402
from tideserve.worker.backends.torch_whisper.model import Whisper  # noqa: E402

SR = 16_000


def _fp8_row_head(x: torch.Tensor) -> torch.Tensor:
    """The served FP8 cache's rounding (``triton_kernels.quantize``, plain PyTorch), undone."""
    from tideserve.worker.backends.torch_whisper.triton_kernels import quantize

    x8, scale = quantize(x)
    return (x8.float() * scale[:, :, None, None]).to(x.dtype)


def _int4(x: torch.Tensor, dims: tuple[int, ...], fp16_scale: bool = False) -> torch.Tensor:
    scale = x.abs().amax(dim=dims, keepdim=True).clamp(min=1e-12) / 7.0
    if fp16_scale:
        scale = scale.half().float()
    return (x / scale).round().clamp(-7, 7) * scale


SCHEMES: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {
    "fp32": None,
    "fp8-row-head": _fp8_row_head,
    "int4-row-head": lambda x: _int4(x, (2, 3)),
    "int4-token-head": lambda x: _int4(x, (3,), fp16_scale=True),
}


def patched_fill_cross(qdq: Callable[[torch.Tensor], torch.Tensor]):
    """``Whisper.fill_cross`` (its non-FP8 path) with ``qdq`` applied to each layer's keys and
    values ``[B, H, 1500, D]`` before they are stored."""

    def fill_cross(self: Whisper, cache, encoded: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        b = encoded.shape[0]
        for i, layer in enumerate(self.decoder.blocks()):
            a = layer.encoder_attn
            k, v = qdq(a.split(a.k_proj(encoded))), qdq(a.split(a.v_proj(encoded)))
            for dst, src in ((cache.cross_k[i], k), (cache.cross_v[i], v)):
                if rows is None:
                    dst[:b].copy_(src)
                else:
                    dst.index_copy_(0, rows, src)

    return fill_cross


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", default="1,5,20")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="comma list; fp32 first for the comparisons")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    without, asked = REQUEST_KINDS["verbose_json"]
    decoding = Decoding(beam_size=1, without_timestamps=without)
    clips = audio.load_en_clips()
    files = [(c.name, c.samples, c.reference) for c in clips]
    files += long_files(clips, [float(x) for x in a.minutes.split(",") if x])
    ts = Tideserve("torch", "cpu-x86_64-fp32", decoding, 8)
    original = Whisper.fill_cross
    rows, texts = [], {}
    try:
        for name in a.schemes.split(","):
            qdq = SCHEMES[name]
            Whisper.fill_cross = original if qdq is None else patched_fill_cross(qdq)  # type: ignore[method-assign]
            for fname, samples, ref in files:
                t0 = time.perf_counter()
                text = " ".join(t.strip() for _, _, t in ts(samples, timestamps=asked))
                texts[(name, fname)] = text
                row = {"scheme": name, "file": fname, "wer": round(audio.wer(ref, text), 4),
                       "wer_vs_fp32": round(audio.wer(texts[("fp32", fname)], text), 4) if ("fp32", fname) in texts
                       else None, "s": round(time.perf_counter() - t0, 2)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        Whisper.fill_cross = original  # type: ignore[method-assign]
    summary = {name: {"summed_wer": round(sum(r["wer"] for r in rows if r["scheme"] == name), 4),
                      "files_differing_from_fp32": sum(1 for r in rows if r["scheme"] == name and r["wer_vs_fp32"])}
               for name in a.schemes.split(",")} if a.schemes.split(",")[0] == "fp32" else {}
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps({"command": "python bench/kv_quant_accuracy.py " + " ".join(sys.argv[1:]),
                                      "rows": rows, "summary": summary,
                                      "texts": [{"scheme": k[0], "file": k[1], "text": v} for k, v in texts.items()]},
                                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
