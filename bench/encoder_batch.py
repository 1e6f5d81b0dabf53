"""CPU seconds per window of CTranslate2's Whisper encoder and beam-search ``generate`` by batch
size (what ``worker.backends.faster_whisper.ENCODE_BATCH`` rests on): the same eight real windows
(bench/accuracy.py's 5-minute file, cut as the worker cuts it), each batch size taking turns with
the others for several rounds, so the host's drift falls on every size alike.

    .venv/bin/python bench/encoder_batch.py --threads 1,2 --rounds 5

Prints one JSON line per intra-op thread count and stage: the median CPU seconds per window for
each batch size, every round's figure, the ratio of each size to the largest, and the median wall
seconds per window (process CPU time counts every thread, spinning included; the wall time is what
a request waits).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import accuracy as A  # noqa: E402


def main() -> int:
    import ctranslate2
    from faster_whisper import WhisperModel
    from faster_whisper.audio import pad_or_trim
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    from tideserve.worker.windows import split_windows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--beam", type=int, default=5)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    samples, _ = A.long_file(A.audio.load_en_clips(), 5, 14)
    windows = split_windows(samples)[: max(sizes)]
    for threads in (int(t) for t in a.threads.split(",")):
        m = WhisperModel(str(A.resolve_pkg(A.BUNDLED)), device="cpu", compute_type="int8", cpu_threads=threads)
        feats = np.stack([pad_or_trim(m.feature_extractor(w.samples)[..., :-1]) for w in windows]).astype(np.float32)
        encoded = np.asarray(m.encode(feats))
        tok = Tokenizer(m.hf_tokenizer, False, task="transcribe", language="en")
        prompt = m.get_prompt(tok, [], without_timestamps=False)
        suppress = list(get_suppressed_tokens(tok, [-1]))

        def encode(b: int, m=m, feats=feats) -> None:
            for i in range(0, len(feats), b):
                m.encode(feats[i:i + b])

        def generate(b: int, m=m, encoded=encoded, prompt=prompt, suppress=suppress) -> None:
            for i in range(0, len(encoded), b):
                rows = np.ascontiguousarray(encoded[i:i + b])
                m.model.generate(ctranslate2.StorageView.from_array(rows), [prompt] * len(rows), beam_size=a.beam,
                                 max_length=448, return_scores=True, return_no_speech_prob=True, suppress_blank=True,
                                 suppress_tokens=suppress, max_initial_timestamp_index=50)

        for stage, run in (("encode", encode), ("generate", generate)):
            run(max(sizes))  # warm-up
            per: dict[int, list[float]] = {b: [] for b in sizes}
            wall: dict[int, list[float]] = {b: [] for b in sizes}
            for r in range(a.rounds):
                for b in sizes if r % 2 == 0 else list(reversed(sizes)):
                    c0, w0 = time.process_time(), time.perf_counter()
                    run(b)
                    per[b].append((time.process_time() - c0) / len(windows))
                    wall[b].append((time.perf_counter() - w0) / len(windows))
            med = {b: statistics.median(v) for b, v in per.items()}
            print(json.dumps({"stage": stage, "threads": threads, "windows": len(windows),
                              "cpu_s_per_window": {b: round(v, 3) for b, v in med.items()},
                              "ratio_to_largest": {b: round(v / med[max(sizes)], 3) for b, v in med.items()},
                              "wall_s_per_window": {b: round(statistics.median(v), 3) for b, v in wall.items()},
                              "rounds": {b: [round(x, 3) for x in v] for b, v in per.items()}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
