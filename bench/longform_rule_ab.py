"""A/B of one of tideserve's long-form rules on long files (issue 13), one run: tideserve's own
pipeline over faster-whisper (tiny.en int8, timestamps, fallback off, the beam given) with the
rule ("after") and without it ("before"), the two taking turns per file (which goes first
alternates with the seed); files from bench/accuracy.py's generator. Rules
(``worker.longform``):
- ``quiet-tail``: a window's rest after a seek is decoded only when it holds speech
  (``tail_holds_speech``; before: every rest is decoded);
- ``repeated-rest``: a rest whose text only repeats the end of the text before it is dropped
  (``repeats_tail``; before: kept);
- ``resumed-rest``: a rest after a seek is decoded over its window's kept encoder output from the
  seek point (the faster-whisper backend's ``resumes``; before: encoded again from its own audio);
- ``rest-quiet-level``: a rest's speech is measured against the window's ``windows.quiet_level``
  (the quietest and loudest second; before: ``frame_guard_sound_s``, the level ``sound_s`` took
  until 2026-12-05: the quietest frame + 10 dB or -50 dBFS, under the loudest frame - 30 dB;
  broadband levels on this side, so since ``windows.band_rms`` the A/B also swaps the band);
- ``resumed-rest-tail``: a resumed rest whose text is the end of the last segment before the seek
  is decoded again from its own audio (``resumed_rest_holds``; before: only one whose text is that
  whole segment, ``resumed_rest_holds_whole_segment``).

    .venv/bin/python bench/longform_rule_ab.py --rule quiet-tail --beam 1
    .venv/bin/python bench/longform_rule_ab.py --rule repeated-rest --beam 5
    .venv/bin/python bench/longform_rule_ab.py --rule resumed-rest --beam 5
    .venv/bin/python bench/longform_rule_ab.py --rule rest-quiet-level --beam 1
    .venv/bin/python bench/longform_rule_ab.py --rule resumed-rest-tail --beam 1

Prints one JSON line per file (WER and seconds of each, and how often the rule decided) and
the totals.
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

import numpy as np  # noqa: E402

from tideserve.spec.models import Decoding  # noqa: E402
from tideserve.worker import engine, longform, windows  # noqa: E402

FILES = "1:13,1:21,1:22,1:23,5:14,5:24,5:25,5:26,20:15,10:31,10:32"


def frame_guard_sound_s(samples: np.ndarray, reference: np.ndarray, sample_rate: int = 16_000) -> float:
    """``windows.sound_s`` as it was before ``windows.quiet_level`` (the A/B's "before" of
    ``rest-quiet-level``): the quiet level of ``reference`` is its quietest 100 ms frame + 10 dB,
    or -50 dBFS if higher, but never over its loudest 100 ms frame - 30 dB."""
    hop = max(1, sample_rate // 50)
    frames = windows.frame_rms(samples, hop)
    ref = windows.frame_rms(reference, max(1, sample_rate // 10))
    if len(frames) == 0 or len(ref) == 0:
        return len(frames) * hop / sample_rate
    ref_db = windows._db(ref)
    limit_db = min(windows.quiet_level_db(ref_db), float(ref_db.max()) - windows.SPEECH_RANGE_DB)
    return int(np.count_nonzero(frames > 10.0 ** (limit_db / 20.0))) * hop / sample_rate


def resumed_rest_holds_whole_segment(window: np.ndarray, result, d: Decoding, sample_rate: int = 16_000,
                                     sought=None) -> bool:
    """``longform.resumed_rest_holds`` as it was until 2026-12-06 (the A/B's "before" of
    ``resumed-rest-tail``): a resumed rest was decoded again for copying the last segment only
    when its text was that whole segment."""
    if not result.text.strip() or result.last_word_end_s is None or longform.needs_fallback(result, d):
        return False
    text = longform._squashed(result.text)
    if sought is not None and text and longform._squashed(sought.last_segment_text) == text:
        return False
    return not longform.tail_holds_speech(window, max(0.0, result.last_word_end_s), sample_rate,
                                          result.unfinished_from_s)


#: rule -> (the engine's name for it, what it answers when switched off, its EngineStats counter);
#: a name starting "backend." is an attribute of the backend, set to the second value to switch it
#: off; one starting "longform." a function of ``worker.longform`` replaced by the second value; an
#: engine name whose second value is a function is replaced by that function
RULES = {"quiet-tail": ("tail_holds_speech", True, "quiet_rests"),
         "repeated-rest": ("repeats_tail", False, "repeated_rests"),
         "resumed-rest": ("backend.resumes", False, "resumed_rests"),
         "rest-quiet-level": ("longform.sound_s", frame_guard_sound_s, "quiet_rests"),
         "resumed-rest-tail": ("resumed_rest_holds", resumed_rest_holds_whole_segment, "redone_rests")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rule", choices=sorted(RULES), default="quiet-tail")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--files", default=FILES, help="minutes:seed pairs, comma-separated")
    a = ap.parse_args()
    attr, off, counter = RULES[a.rule]
    clips = A.audio.load_en_clips()
    t = A.Tideserve("faster-whisper", "cpu-x86_64-int8", Decoding(beam_size=a.beam, without_timestamps=False), 8)
    owner: object = engine
    if attr.startswith("backend."):
        owner, attr = t.backend, attr.removeprefix("backend.")
    elif attr.startswith("longform."):
        owner, attr = longform, attr.removeprefix("longform.")
    rule = getattr(owner, attr)
    t(clips[0].samples)  # warm-up
    wer = {"before": 0.0, "after": 0.0}
    secs = {"before": 0.0, "after": 0.0}
    for pair in a.files.split(","):
        minutes, seed = float(pair.split(":")[0]), int(pair.split(":")[1])
        samples, ref = A.long_file(clips, minutes, seed)
        row: dict = {"minutes": minutes, "seed": seed}
        for side in ("before", "after") if seed % 2 else ("after", "before"):
            before = off if owner is not engine or callable(off) else (lambda *_, v=off: v)
            setattr(owner, attr, before if side == "before" else rule)
            t0 = time.perf_counter()
            segs = t(samples)
            dt = time.perf_counter() - t0
            w = A.audio.wer(ref, " ".join(x[2].strip() for x in segs))
            row[side], row[f"{side}_s"] = round(w, 4), round(dt, 1)
            if side == "after":
                row["fired"] = getattr(t.last_stats, counter)  # times the rule decided
                if a.rule == "resumed-rest":
                    row["redone"] = t.last_stats.redone_rests
            wer[side] += w
            secs[side] += dt
        print(json.dumps(row), flush=True)
    setattr(owner, attr, rule)
    print("total", json.dumps({"rule": a.rule, "beam": a.beam, "wer": {k: round(v, 4) for k, v in wer.items()},
                               "seconds": {k: round(v, 1) for k, v in secs.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
