"""The quiet-tail rule on the real model (issue 13): the window of bench/accuracy.py's 5-minute
file (seed 14) where tiny.en at beam 1 invented a sentence over a pause, decoded by the engine
loop over the faster-whisper backend as the worker does."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tideserve.spec.models import Decoding
from engine_run import bundled_backend, decode_window
from tideserve.worker import engine
from tideserve.worker.windows import sound_s

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

SR = 16_000
DECODING = Decoding(beam_size=1, without_timestamps=False)


@pytest.fixture(scope="module")
def backend():
    return bundled_backend(DECODING)


@pytest.fixture(scope="module")
def window(en_clips) -> np.ndarray:
    """105.20-133.15 s of the file: eight clips, the last the counting clip, then 1 s of pause
    cut in its middle (the windows ``worker.windows.split_windows`` cuts there)."""
    from longfiles import long_file

    samples, _ = long_file(en_clips, 5, seed=14)
    return (np.clip(samples[int(105.2 * SR): int(133.15 * SR)], -1, 1) * 32767).astype(np.int16)


def transcribe(backend, window: np.ndarray) -> tuple[list, int]:
    segments, stats = decode_window(backend, DECODING, window, 105.2)
    return segments, stats.seeks


def test_the_rest_of_a_window_over_a_pause_is_not_decoded_into_an_invented_sentence(backend, window, monkeypatch):
    segments, seeks = transcribe(backend, window)
    assert seeks == 0
    assert [s.text for s in segments][-1].replace("-", " ").rstrip(".").split() == [str(i) for i in range(1, 11)]
    assert segments[-1].end_s <= 133.15
    assert not any("next time" in s.text for s in segments)
    # Why: the decode closes the counting clip at 132.20 s, early, and the rest after it holds
    # 0.1 s of that clip's last sound in the speech band (60 ms by the broadband frame-guard
    # level before ``quiet_level``), then the pause.
    assert segments[-1].end_s == pytest.approx(132.2)
    assert sound_s(window[round(27.0 * SR):], window) == pytest.approx(0.1)
    # The same window when every rest is decoded (the rule before): the rest comes back as a
    # sentence the audio does not hold (with this model: "And then we'll see you next time.").
    # (The rest from its own audio, as without the resumed rest: resumed over the window's
    # encoder output, this model writes "10." again there, dropped as a repeated rest.)
    monkeypatch.setattr(engine, "tail_holds_speech", lambda *a: True)
    monkeypatch.setattr(backend, "resumes", False)
    segments, seeks = transcribe(backend, window)
    assert seeks == 1 and segments[-1].start_s == pytest.approx(132.2)
    invented = segments[-1].text.lower()
    assert invented and not any(w in invented for w in ("hello", "fox", "10"))
