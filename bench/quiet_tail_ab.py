"""A/B of the quiet-tail rule (issue 13, ``worker.longform.tail_holds_speech``) on long files,
one run: tideserve's own pipeline over faster-whisper (tiny.en int8, timestamps, fallback off,
the beam given) with the rule ("after") and with every window's rest decoded after a seek, as
before ("before"), the two taking turns per file (which goes first alternates with the seed);
files from bench/accuracy.py's generator.

    .venv/bin/python bench/quiet_tail_ab.py --beam 1
    .venv/bin/python bench/quiet_tail_ab.py --beam 5

Prints one JSON line per file (WER and seconds of each) and the totals.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

import accuracy as A  # noqa: E402

from tideserve.spec.models import Decoding  # noqa: E402
from tideserve.worker import engine  # noqa: E402

FILES = "1:13,1:21,1:22,1:23,5:14,5:24,5:25,5:26,20:15,10:31,10:32"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--files", default=FILES, help="minutes:seed pairs, comma-separated")
    a = ap.parse_args()
    rule = engine.tail_holds_speech
    clips = A.audio.load_en_clips()
    t = A.Tideserve("faster-whisper", "cpu-x86_64-int8", Decoding(beam_size=a.beam, without_timestamps=False), 8)
    t(clips[0].samples)  # warm-up
    wer = {"before": 0.0, "after": 0.0}
    secs = {"before": 0.0, "after": 0.0}
    for pair in a.files.split(","):
        minutes, seed = float(pair.split(":")[0]), int(pair.split(":")[1])
        samples, ref = A.long_file(clips, minutes, seed)
        row: dict = {"minutes": minutes, "seed": seed}
        for name in ("before", "after") if seed % 2 else ("after", "before"):
            engine.tail_holds_speech = (lambda *_: True) if name == "before" else rule
            t0 = time.perf_counter()
            segs = t(samples)
            dt = time.perf_counter() - t0
            w = A.audio.wer(ref, " ".join(x[2].strip() for x in segs))
            row[name], row[f"{name}_s"] = round(w, 4), round(dt, 1)
            wer[name] += w
            secs[name] += dt
        print(json.dumps(row), flush=True)
    engine.tail_holds_speech = rule
    print("total", json.dumps({"beam": a.beam, "wer": {k: round(v, 4) for k, v in wer.items()},
                               "seconds": {k: round(v, 1) for k, v in secs.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
