"""Long quiet stretches left out of the windows (``worker.windows.window_cuts``, issue 13), on
the real model: the prep's windows decoded by the engine loop over the faster-whisper backend
(tiny.en int8, beam 5, the worker's defaults), as the worker does.

Found by an adversarial pass through the gateway and reproduced in-process: a 3 s clip between
two minutes of silence came back at 52.00-59.00 s when spoken at 60.00-62.89 s (the window held
8 s of silence before it; Whisper timed the speech from the window's start), and with room noise
(-60 dBFS) instead of digital silence the same file also came back with nine "." segments."""

from __future__ import annotations

import numpy as np
import pytest

from engine_run import bundled_backend, decode_windows
from tideserve.protocol import TranscriptionRequest
from tideserve.spec.models import Decoding
from tideserve.worker.audio import wav_file
from tideserve.worker.prep import prepare_audio

SR = 16_000
DECODING = Decoding(beam_size=5, without_timestamps=False)


@pytest.fixture(scope="module")
def backend():
    return bundled_backend(DECODING)


@pytest.mark.parametrize("quiet", ["digital silence", "room noise"])
def test_speech_between_long_quiet_stretches_is_timed_where_it_is_spoken(backend, en_clips, quiet) -> None:
    clip = next(c for c in en_clips if c.name == "quick_brown_fox")
    rng = np.random.default_rng(5)
    gap = (lambda: np.zeros(60 * SR, np.float32)) if quiet == "digital silence" else \
        (lambda: rng.normal(0, 10 ** (-60 / 20), 60 * SR).astype(np.float32))
    samples = np.concatenate([gap(), clip.samples, gap()])
    pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    prepared = prepare_audio(TranscriptionRequest(audio=wav_file(pcm), timestamps=True), None)
    (cut,) = prepared.cuts  # one window: the clip and 0.4 s of quiet either side of its sound
    assert cut[0] / SR == 59.6 and 62.5 <= cut[1] / SR <= 60 + len(clip.samples) / SR + 0.4, cut
    assert prepared.duration_s == len(pcm) / SR
    results, _ = decode_windows(backend, DECODING, [(w, off) for w, off, _ in prepared.segments()])
    segments = [s for r in results for s in r.segments]
    assert [s.text.strip() for s in segments] == ["The quick brown fox jumps over the lazy dog."]
    (s,) = segments
    assert 59.5 <= s.start_s <= 60.1 and 62.0 <= s.end_s <= 63.4, (s.start_s, s.end_s)


def test_a_short_window_keeps_its_text_inside_its_audio(backend) -> None:
    """Found by adversarial testing: 5 s of zeros with one 1 ms click came back with segments
    from 2.6 s to 29.6 s (past the file's end), each ending at 2.5 s: text the model wrote over
    the window's padding (1.6-2.5 s, then zeros to 30 s), timed from there
    (``whisper_text.within_audio``). A click alone is no longer a window of its own
    (tests/unit/worker/test_windows.py); its window is decoded here as the prep cut it then."""
    x = np.zeros(5 * SR, np.int16)
    x[2 * SR: 2 * SR + 16] = int(0.9 * 32767)
    a, b = round(1.6 * SR), round(2.5 * SR)
    results, _ = decode_windows(backend, DECODING, [(x[a:b], 1.6)])
    segments = [s for r in results for s in r.segments]
    assert all(1.6 <= s.start_s <= s.end_s <= 2.5 for s in segments), [(s.start_s, s.end_s) for s in segments]
