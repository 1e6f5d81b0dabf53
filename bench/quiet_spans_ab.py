"""A/B of leaving long quiet stretches out of the windows (``worker.windows.window_cuts``, issue
13), one run: tideserve's own pipeline over faster-whisper (tiny.en int8, timestamps, the beam
given) with the rule ("after") and with the whole file cut into windows as before
("before"; ``--before broadband``: the rule with levels over the whole band, ``frame_rms``,
instead of the speech band's, ``band_rms``, in the rule and in a rest's measure of speech), the
two taking turns per file (which goes first alternates).

Files (bench/longfiles.py):
- ``spaced``: the clips with long gaps (``--gap`` seconds, uniform), of digital zeros or of low
  room noise (peak -60 to -54 dBFS), alternately by seed: what the rule is for;
- ``long``: bench/accuracy.py's and the other A/Bs' files (gaps of 0.4-1.6 s): the rule must not
  change them (gaps under 2 s are never left out).

Per file and side: WER, segments without words (".": text the normaliser empties), segments
with words that overlap no clip's time (text placed in a gap), segments over more than one
clip (their times span the gap between), the mean distance from each clip's
start to the start of the first segment overlapping it (s), parts decoded (windows and their rests: ``EngineStats.windows``), seconds.

    .venv/bin/python bench/quiet_spans_ab.py --beam 5
    .venv/bin/python bench/quiet_spans_ab.py --beam 5 --before broadband --long 1:13,1:21,1:22,1:23,5:14,5:24,5:25,5:26,20:15,10:31,10:32
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
from longfiles import spaced_file  # noqa: E402

from tideserve.spec.models import Decoding  # noqa: E402
from tideserve.worker import prep, windows  # noqa: E402

SPACED = "3:41,3:42,3:43,3:44,5:45,5:46"
LONG = "1:13,1:21,5:14,5:24,20:15"


def placement(segs: list[tuple[float, float, str]], clips: list[tuple[float, float]]) -> dict:
    """Segments without words, segments with words outside every clip, segments over more than
    one clip (so over the gap between them), and the mean distance from a clip's start to the
    start of the first segment overlapping it (clips with none are not counted)."""
    norm = A.audio._normalise
    worded = [(a, b) for a, b, t in segs if norm(t).strip()]
    outside = sum(not any(a < ce and b > cs for cs, ce in clips) for a, b in worded)
    merged = sum(sum(a < ce and b > cs for cs, ce in clips) > 1 for a, b in worded)
    dist = [abs(min(a for a, b in worded if a < ce and b > cs) - cs) for cs, ce in clips
            if any(a < ce and b > cs for a, b in worded)]
    return {"wordless": len(segs) - len(worded), "in_gap": outside, "merged": merged,
            "start_err_s": round(sum(dist) / max(1, len(dist)), 2)}


def whole_file(pcm, sample_rate: int = 16_000) -> list[tuple[int, int]]:
    """The windows as before the rule: the whole file cut by ``split_windows``."""
    out, start = [], 0
    for w in windows.split_windows(pcm, sample_rate):
        out.append((start, start + len(w.samples)))
        start += len(w.samples)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--spaced", default=SPACED, help="minutes:seed pairs of spaced files, comma-separated")
    ap.add_argument("--long", default=LONG, help="minutes:seed pairs of bench/accuracy.py's files")
    ap.add_argument("--gap", default="2,40", help="spaced files' gap range, seconds: lo,hi")
    ap.add_argument("--before", choices=("whole", "broadband"), default="whole",
                    help="the 'before' side: the whole file cut, or the rule on broadband levels")
    ap.add_argument("--pad", type=float, help="quiet kept either side of sound, s (default: worker.windows.QUIET_PAD_S)")
    a = ap.parse_args()
    if a.pad is not None:
        if not 0 <= a.pad <= windows.SKIP_QUIET_S / 2:
            ap.error(f"--pad must be 0-{windows.SKIP_QUIET_S / 2:g} s (half the shortest quiet run left out)")
        windows.QUIET_PAD_S = a.pad
    clips = A.audio.load_en_clips()
    t = A.Tideserve("faster-whisper", "cpu-x86_64-int8", Decoding(beam_size=a.beam, without_timestamps=False), 8)
    t(clips[0].samples)  # warm-up
    rule, band = prep.window_cuts, windows.band_rms

    def broadband(samples, frame, sample_rate=16_000):
        return windows.frame_rms(samples, frame)
    gap = tuple(float(x) for x in a.gap.split(","))
    files = [("spaced", p) for p in a.spaced.split(",") if p] + [("long", p) for p in a.long.split(",") if p]
    total = {side: {"wer": 0.0, "wordless": 0, "in_gap": 0, "merged": 0, "s": 0.0} for side in ("before", "after")}
    for kind, pair in files:
        minutes, seed = float(pair.split(":")[0]), int(pair.split(":")[1])
        if kind == "spaced":
            samples, ref, spans = spaced_file(clips, minutes, seed, gap, digital=seed % 2 == 0)
        else:
            samples, ref, spans = spaced_file(clips, minutes, seed)
        row: dict = {"file": kind, "minutes": minutes, "seed": seed, "audio_s": round(len(samples) / 16_000, 1)}
        for side in ("before", "after") if seed % 2 else ("after", "before"):
            if a.before == "whole":
                prep.window_cuts = rule if side == "after" else whole_file
            else:
                windows.band_rms = band if side == "after" else broadband
            t0 = time.perf_counter()
            segs = t(samples)
            dt = time.perf_counter() - t0
            w = A.audio.wer(ref, " ".join(x[2].strip() for x in segs))
            row[side] = {"wer": round(w, 4), **placement(segs, spans), "decodes": t.last_stats.windows,
                         "s": round(dt, 1)}
            for k, v in (("wer", w), ("wordless", row[side]["wordless"]), ("in_gap", row[side]["in_gap"]),
                         ("merged", row[side]["merged"]), ("s", dt)):
                total[side][k] += v
        prep.window_cuts, windows.band_rms = rule, band
        print(json.dumps(row), flush=True)
    print("total", json.dumps({"beam": a.beam, "before": a.before, "gap_s": gap, "pad_s": windows.QUIET_PAD_S,
                               **{side: {k: round(v, 4) for k, v in d.items()} for side, d in total.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
