"""The resumed rest on the real model (issue 13, speed on long files): a window of
bench/accuracy.py's 20-minute file (seed 15) whose beam-5 decode stops at 21.0 s of its 23.8 s,
before the last clip ("Hello world"); its rest is decoded over the window's kept encoder output
from 21.0 s, with one encoder pass for the window instead of two, and the same words as when the
rest is encoded again from its own audio."""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tideserve.spec.models import Decoding, Target
from audio import wer
from engine_run import BUNDLED, bundled_backend, decode_window
from tideserve.worker.engine import EngineStats

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

SR = 16_000
DECODING = Decoding(beam_size=5, without_timestamps=False)
START, END = 25.55, 49.35  # the window worker.windows.split_windows cuts there


@pytest.fixture(scope="module")
def backend():
    return bundled_backend(DECODING)


@pytest.fixture(scope="module")
def window(en_clips) -> np.ndarray:
    from longfiles import long_file

    samples, _ = long_file(en_clips, 20, seed=15)
    return (np.clip(samples[int(START * SR): int(END * SR)], -1, 1) * 32767).astype(np.int16)


def transcribe(backend, window: np.ndarray) -> tuple[list, EngineStats, int]:
    """Segments, the engine's summed counters, and the encoder passes run (windows encoded)."""
    encodes = []
    encode = backend._model.encode

    def counting(features, *a, **kw):
        encodes.append(len(features))
        return encode(features, *a, **kw)

    backend._model.encode = counting
    try:
        segments, stats = decode_window(backend, DECODING, window, START)
    finally:
        del backend._model.encode
    return segments, stats, sum(encodes)


def words(segments) -> list[str]:
    return re.sub(r"[^a-z0-9 ]", " ", " ".join(s.text for s in segments).lower().replace("-", " ")).split()


def test_the_rest_after_a_seek_is_decoded_over_the_windows_encoder_output(backend, window, monkeypatch):
    segments, stats, encodes = transcribe(backend, window)
    assert (stats.seeks, stats.resumed_rests, stats.redone_rests) == (1, 1, 0)
    assert encodes == 1  # one encoder pass for the window and its rest
    assert words(segments)[-2:] == ["hello", "world"]
    last = segments[-1]
    assert last.start_s == pytest.approx(START + 21.0) and last.end_s <= END
    assert all(a.end_s <= b.start_s + 1e-6 for a, b in itertools.pairwise(segments))  # in order, no overlap
    # The rest encoded again from its own audio (openai/whisper's way): two encoder passes,
    # the same words.
    monkeypatch.setattr(backend, "resumes", False)
    fresh, stats, encodes = transcribe(backend, window)
    assert (stats.seeks, stats.resumed_rests, encodes) == (1, 0, 2)
    assert words(fresh) == words(segments)


def test_a_resumed_window_decodes_in_one_batch_with_fresh_and_untimed_windows(window, en_clips):
    """Found in review: with ``without_timestamps: true`` (then the default), a resumed window's prompt
    (<|startoftranscript|> and its forced timestamp) was grouped with an untimed one
    (<|startoftranscript|><|notimestamps|>): the same length, but CTranslate2 counts only the
    second as a task token, and refused the whole batch."""
    from tideserve.sources.local import resolve_pkg
    from tideserve.worker.backends.base import Resume, WindowTask
    from tideserve.worker.backends.faster_whisper import FasterWhisperBackend

    backend = FasterWhisperBackend(resolve_pkg(BUNDLED), Target.parse("cpu-x86_64-int8"), Decoding(beam_size=5),
                                   max_batch_size=4)
    (head,), _ = backend.transcribe_batch([WindowTask(window, START, timestamps=True)])
    assert head.unfinished_from_s == pytest.approx(21.0) and head.encoded is not None
    clip = (np.clip(en_clips[0].samples, -1, 1) * 32767).astype(np.int16)
    results, _ = backend.transcribe_batch([
        WindowTask(window, START, timestamps=True, resume=Resume(21.0, head.encoded)),
        WindowTask(clip, 0.0, timestamps=True), WindowTask(clip, 0.0, timestamps=False)])
    rest, timed, untimed = results
    assert words(rest.segments) == ["hello", "world"] and rest.segments[0].start_s == pytest.approx(START + 21.0)
    assert rest.last_word_end_s is not None and 21.0 < rest.last_word_end_s <= END - START
    assert timed.segments and not untimed.segments
    # the same words either way (as the WER normaliser reads them: "One, two" and "1-2" alike,
    # which of the two a window writes turns on the CPU's int8 kernels)
    assert wer(untimed.text, " ".join(s.text for s in timed.segments)) == 0.0


def test_a_resumed_rests_last_word_is_timed_from_the_seek_point_inside_its_clip(backend, window, en_clips):
    """The last word's end of a resumed rest is aligned over the kept encoder output from the seek
    point on, the rest's text alone (a tenth of the cost of the window's whole text over the
    whole window): "World" ends inside the "Hello world" clip the rest holds (22.17-23.31 s of
    the window), within 0.15 s of the end the whole window's alignment gives."""
    import ctranslate2
    from longfiles import spaced_file
    from tideserve.worker.backends.base import Resume, WindowTask
    from tideserve.worker.backends.faster_whisper import _spoken

    _, _, spans = spaced_file(en_clips, 20, seed=15)
    clip_start, clip_end = next((a - START, b - START) for a, b in spans if START + 21.0 < a < END)
    assert (round(clip_start, 2), round(clip_end, 2)) == (22.17, 23.31)
    (head,), _ = backend.transcribe_batch([WindowTask(window, START, timestamps=True)])
    (rest,), _ = backend.transcribe_batch([WindowTask(window, START, timestamps=True, resume=Resume(21.0, head.encoded))])
    assert words(rest.segments) == ["hello", "world"]
    assert rest.last_word_end_s is not None and clip_start + 0.4 < rest.last_word_end_s <= clip_end
    tok = backend._tokenizer("en")
    whole = ctranslate2.StorageView.from_array(np.ascontiguousarray(head.encoded.encoder_output[None]))
    (aligned,) = backend._model.find_alignment(tok, [[*_spoken(tok, head), *_spoken(tok, rest)]], whole,
                                               len(window) // 160)
    end_over_the_whole_window = [w["end"] for w in aligned if any(c.isalnum() for c in w["word"])][-1]
    assert rest.last_word_end_s == pytest.approx(end_over_the_whole_window, abs=0.15)


def _encoded(backend, samples: np.ndarray) -> np.ndarray:
    """The window's encoder output ``[1500, d_model]``, computed as the backend computes it."""
    feats = backend._features(backend._model.feature_extractor, samples)
    return backend._encode(backend._model, feats[None].astype(np.float32))[0].copy()


def test_a_resumed_rest_that_stopped_before_its_speech_is_timed_over_the_whole_window(backend, en_clips):
    """Found in review: aligned alone from the seek point, a rest whose text stops before the
    speech after the seek does ("The Quick Brown Fox" of "... jumps over the lazy dog", with
    "Hello world" after it) has its last word stretched to the window's end (28.62 s of 28.65),
    so no sound seems to follow it and the rest would be kept with its words lost. Such an end is
    aligned again with the window's whole text, over the whole window: "Fox" ends at 24.76 s,
    and the sound after it sends the rest to be decoded again. bench/accuracy.py's 10-minute
    file (seed 32), the window its beam-1 decode sought at 23.0 s."""
    from longfiles import spaced_file
    from tideserve.worker.backends.base import Resume, WindowTask
    from tideserve.worker.backends.faster_whisper import SUSPECT_END_S, _aligned_end, _Kept
    from tideserve.worker.longform import tail_holds_speech
    from tideserve.worker.windows import window_cuts

    samples, _, _ = spaced_file(en_clips, 10, seed=32)
    pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    a, b = next((a, b) for a, b in window_cuts(pcm) if round(a / SR, 2) == 75.65)
    window = pcm[a:b]
    tok, model = backend._tokenizer("en"), backend._model
    before = ("Hello World. The Quick Brown Fox jumps over the lazy dog. Hello World. 1-2-3-4-5-6-7-8-9-10. "
              "The Quick Brown Fox jumps over the lazy dog. Hello World. 1-2-3-4-5-6-7-8-9-10.")
    encoded = _encoded(backend, window)
    kept = _Kept(encoded, tuple(tok.encode(" " + before)))
    task = WindowTask(window, a / SR, timestamps=True, resume=Resume(23.0, kept))
    short = tuple(tok.encode(" The Quick Brown Fox"))
    assert _aligned_end(model, tok, encoded, short, len(window), round(23.0 / 0.02)) >= len(window) / SR - SUSPECT_END_S
    end = backend._last_word_end(model, task, tok, short)
    assert end is not None and 24.0 < end < 25.2  # the clip runs 23.49-26.38 s of the window
    assert tail_holds_speech(window, end, SR, None)
    # The whole sentence is timed from the seek point alone: inside its clip.
    whole = tuple(tok.encode(" The Quick Brown Fox jumps over the lazy dog."))
    end = backend._last_word_end(model, task, tok, whole)
    assert end is not None and 25.9 < end <= 26.38


def test_an_encoder_output_slice_as_long_as_the_mel_bins_is_aligned_as_an_encoder_output(backend, en_clips):
    """Found in review: CTranslate2 takes an input whose second dimension is the model's mel bin
    count (80 for tiny.en) as features to encode, so a slice of exactly 80 encoder positions (a
    seek at 28.40 s) was encoded again and "over" ended at 29.94 s, where seeks 20 ms either side
    give 29.24. Such a slice starts one position earlier. Fewer than two feature frames give None
    (faster-whisper raised IndexError). bench/accuracy.py's 5-minute file (seed 15), 12-42 s."""
    from longfiles import long_file
    from tideserve.worker.backends.faster_whisper import _aligned_end

    samples, _ = long_file(en_clips, 5, seed=15)
    window = (np.clip(samples[12 * SR: 42 * SR], -1, 1) * 32767).astype(np.int16)
    tok, model = backend._tokenizer("en"), backend._model
    encoded = _encoded(backend, window)
    assert len(encoded) - 1420 == model.model.n_mels
    text = tuple(tok.encode(" The quick brown fox jumps over"))
    ends = [_aligned_end(model, tok, encoded, text, len(window), first) for first in (1419, 1420, 1421)]
    assert all(e is not None for e in ends) and max(ends) - min(ends) <= 0.1, ends
    assert _aligned_end(model, tok, encoded, text, 2 * 160 * 1400 + 160, 1400) is None


def test_a_resumed_rest_that_writes_the_windows_sentence_again_is_decoded_from_its_own_audio(
        backend, en_clips, monkeypatch):
    """Found by adversarial testing: a sentence spoken at 20.0-22.9 s between ticks (5 ms bursts
    every 0.25 s, over 20 s of silence either side) came back twice: the window was written
    0.0-24.0 s and sought there, and its rest, decoded over the window's encoder output, wrote
    the same sentence again. Decoded from its own audio, the rest holds only ticks."""
    from tideserve.worker import engine
    from tideserve.worker.windows import window_cuts

    fox = next(c for c in en_clips if c.name == "quick_brown_fox").samples
    s = np.concatenate([np.zeros(20 * SR, np.float32), fox, np.zeros(20 * SR, np.float32)])
    rng = np.random.default_rng(0)
    tick = (rng.standard_normal(80) * np.exp(-np.arange(80) / 16)).astype(np.float32)
    tick *= 0.1 / np.abs(tick).max()
    for i in range(0, len(s) - 80, SR // 4):
        s[i: i + 80] += tick
    pcm = (np.clip(s, -1, 1) * 32767).astype(np.int16)
    a, b = window_cuts(pcm)[0]
    assert (a, b) == (0, round(29.9 * SR))  # the ticks are sound: no quiet stretch is left out
    segments, stats = decode_window(backend, DECODING, pcm[a:b], 0.0)
    assert [s.text.strip() for s in segments] == ["The quick brown fox jumps over the lazy dog."]
    assert (stats.seeks, stats.resumed_rests, stats.redone_rests) == (1, 1, 1)
    # Without comparing the rest with the segment before it (the rule before): twice.
    holds = engine.resumed_rest_holds
    monkeypatch.setattr(engine, "resumed_rest_holds", lambda *args: holds(*args[:4]))
    segments, _ = decode_window(backend, DECODING, pcm[a:b], 0.0)
    assert [s.text.strip() for s in segments] == ["The quick brown fox jumps over the lazy dog."] * 2
