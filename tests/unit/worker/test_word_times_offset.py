"""Word timestamps (faster-whisper backend, real tiny.en, CPU) do not depend on where in a file a
window lies, so a part of a spread file gets the words the whole file gets."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tideserve.spec.models import Decoding
from tideserve.worker.backends.base import WindowTask
from engine_run import bundled_backend

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
SR = 16_000
OFFSET_S, END_S = 77.65, 106.2  # where worker.windows cuts the file below: a part of it began there


def test_a_windows_word_times_are_the_same_at_its_place_in_the_file_and_alone(en_clips) -> None:
    # Found by adversarial testing: a 160 s file spread over two replicas at 77.65 s came back with
    # the first word of one segment at 91.69 s, and at 92.13 s on one replica. faster-whisper
    # rounds word times to 0.01 s and compares word lengths with thresholds: on the file's time
    # the rounding fell otherwise and moved the word. Words are now timed from the window's start.
    from longfiles import spaced_file

    samples, _, _ = spaced_file(en_clips, 160 / 60, seed=160)
    window = (np.clip(samples[round(OFFSET_S * SR): round(END_S * SR)], -1, 1) * 32767).astype(np.int16)
    backend = bundled_backend(Decoding(beam_size=5, without_timestamps=False))
    placed, _ = backend.transcribe_batch([WindowTask(window, offset_s=OFFSET_S, timestamps=True, words=True)])
    alone, _ = backend.transcribe_batch([WindowTask(window, offset_s=0.0, timestamps=True, words=True)])
    words = [(round(w.start_s, 2), round(w.end_s, 2), w.word) for s in placed[0].segments for w in s.words]
    shifted = [(round(w.start_s + OFFSET_S, 2), round(w.end_s + OFFSET_S, 2), w.word)
               for s in alone[0].segments for w in s.words]
    assert len(words) > 40 and words == shifted
    assert [round(s.start_s, 2) for s in placed[0].segments if 91 < s.start_s < 93] == [91.69]  # as the part's
