"""Spreading a long file over replicas (issue 13): cutting it into parts of whole windows
(``worker.prep.spread``) and joining the parts' results (``protocol.internal``)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from tideserve.errors import BadInputError
from tideserve.protocol.internal import joined, parse_part_options, part_options, result_from_json, result_to_json
from tideserve.protocol.types import Segment, TranscriptionRequest, TranscriptionResult, Word
from tideserve.worker.audio import SAMPLE_RATE, pcm16_wav, wav_file
from tideserve.worker.backends.base import WindowResult
from tideserve.worker.prep import Prepared, prepare_audio, spread

SR = SAMPLE_RATE


def _prepared(window_s: list[float]) -> Prepared:
    """A file of windows of the given lengths (samples numbered so that slices can be checked)."""
    edges = np.cumsum([0, *(round(s * SR) for s in window_s)])
    pcm = (np.arange(edges[-1]) % 30_000).astype(np.int16)
    cuts = tuple((int(a), int(b)) for a, b in itertools.pairwise(edges))
    return Prepared(TranscriptionRequest(audio=b""), pcm, cuts, silent=tuple(i == 2 for i in range(len(cuts))))


def test_a_file_is_cut_at_window_ends_nearest_the_even_split():
    p = _prepared([30, 30, 20, 30, 10, 30])  # 150 s
    out = spread(p, parts=3, min_part_s=30, stretch_s=0.0)
    # Window ends 30, 60, 80, 110, 120, 150 s; the even split is 50 s and 100 s: nearest ends 60 s and 110 s.
    assert [c for c in out.cuts] == list(p.cuts[:2])
    assert [(r.start / SR, r.end / SR) for r in out.remote] == [(60.0, 110.0), (110.0, 150.0)]
    assert out.duration_s == 150.0 and len(out.pcm) == 60 * SR and out.silent == (False, False)
    for r in out.remote:  # each part's audio is its slice of the file, as a WAV file
        assert np.array_equal(pcm16_wav(r.wav), p.pcm[r.start: r.end])
    assert out.remote[0].offset_s == 60.0


def test_parts_are_at_least_min_part_s_and_at_most_parts():
    p = _prepared([30] * 10)  # 300 s
    assert len(spread(p, parts=8, min_part_s=100).remote) == 2  # 3 parts of 100 s
    assert len(spread(p, parts=2, min_part_s=10).remote) == 1
    assert spread(p, parts=8, min_part_s=301) is p  # shorter than two parts: as it is
    one = _prepared([200])  # one window: nothing to cut
    assert spread(one, parts=4, min_part_s=10) is one


def test_windows_are_never_split_and_no_part_is_empty():
    p = _prepared([29.5, 0.5, 0.5, 29.5])  # the even split falls in a window: parts take whole windows
    out = spread(p, parts=4, min_part_s=5)
    bounds = [(0, out.cuts[-1][1])] + [(r.start, r.end) for r in out.remote]
    assert all(a < b for a, b in bounds) and bounds[-1][1] == p.cuts[-1][1]
    assert {a for a, _ in bounds[1:]} <= {a for a, _ in p.cuts}  # every part starts where a window starts
    assert all(b == nxt for (_, b), (nxt, _) in itertools.pairwise(bounds))


def _result(text: str, times: list[tuple[float, float]], lang: str = "en") -> TranscriptionResult:
    segs = [Segment(a, b, f"{text}{i}", tokens=(1, 2), avg_logprob=-0.2, words=(Word(a, b, "w", 0.9),),
                    window_start_s=a) for i, (a, b) in enumerate(times)]
    return TranscriptionResult(text, lang, 10.0, segs, language_probability=0.9)


def test_results_round_trip_through_json_and_join_in_file_time():
    first = TranscriptionResult("one", "en", 60.0, [Segment(0.0, 2.0, "one")], detected_language="en",
                                detected_language_probability=0.8, language_mismatch=False)
    second = _result("two", [(0.0, 1.5), (3.0, 4.0)], lang="fr")
    back = result_from_json(result_to_json(second))
    assert back == second
    out = joined(first, [(110.0, _result("three", [(1.0, 2.0)])), (60.0, back)], duration_s=150.0)
    assert out.text == "one two three" and out.duration_s == 150.0
    assert [(s.start_s, s.end_s) for s in out.segments] == [(0.0, 2.0), (60.0, 61.5), (63.0, 64.0), (111.0, 112.0)]
    assert out.segments[2].words[0].start_s == 63.0 and out.segments[2].window_start_s == 63.0
    assert out.language == "en" and out.detected_language == "en"  # the first part's
    assert joined(first, [(60.0, TranscriptionResult("", "en", 5.0))], 65.0).text == "one"


def test_part_options_round_trip_and_bad_ones_are_refused_as_every_api_refuses_them():
    o = parse_part_options(part_options("a prompt 日本語" * 300, "EN", True, "transcribe", False))
    assert o == {"prompt": "a prompt 日本語" * 300, "language": "en", "timestamps": True, "task": "transcribe",
                 "words": False, "cuts": None}
    with_cuts = part_options(None, None, True, "transcribe", False, ((0, 16_000), (48_000, 96_000)))
    assert parse_part_options(with_cuts)["cuts"] == ((0, 16_000), (48_000, 96_000))
    good = part_options(None, None, True, "transcribe", False)
    for bad, says in (("", "must be JSON"), ("[" * 5000, "must be JSON"), ("[]", "JSON object"),
                      (good[:-1] + ',"cuts":[]}', "'cuts' must be a non-empty list"),
                      (good[:-1] + ',"cuts":[[0, 1.5]]}', "'cuts' must be a non-empty list"),
                      (good[:-1] + ',"cuts":[[0, true]]}', "'cuts' must be a non-empty list"),
                      (good[:-1] + ',"cuts":[[0, 10], [5, 20]]}', r"in order without overlap, from sample 0; \[5, 20\]"),
                      (good[:-1] + ',"cuts":[[-1, 10]]}', r"\[-1, 10\] is not"),
                      (good[:-1] + ',"cuts":[[10, 10]]}', r"\[10, 10\] is not"),
                      (good[:-1] + ',"extra":1}', "JSON object"),
                      ('{"prompt": null}', "JSON object"), (good.replace("true", '"yes"'), "'timestamps'"),
                      (good.replace("null,", '"\\ud800",', 1), "lone UTF-16 surrogate"),
                      (good.replace('"transcribe"', '"bogus"'), "task must be"),
                      (good.replace('"language":null', '"language":"e n"'), "language code")):
        with pytest.raises(BadInputError, match=says):
            parse_part_options(bad)


def test_the_part_holding_the_files_first_sound_identifies_its_language():
    p = _prepared([30, 30, 20, 30, 10, 30])
    silent = dataclasses.replace(p, silent=(True, True, True, False, False, False))  # sound from 80 s
    out = spread(silent, parts=3, min_part_s=30, stretch_s=0.0)
    assert [r.identify for r in out.remote] == [True, False]  # the part of 60-110 s holds the window at 80 s
    assert [r.identify for r in spread(p, parts=3, min_part_s=30, stretch_s=0.0).remote] == [False, False]  # sound in part 0


def test_the_identification_comes_from_the_first_part_that_has_one():
    first = TranscriptionResult("", "en", 60.0, [])  # all silence: nothing identified
    fr = TranscriptionResult("bonjour", "en", 30.0, [], detected_language="fr", detected_language_probability=0.9,
                             language_mismatch=True)
    en = TranscriptionResult("hello", "en", 30.0, [], detected_language="en", detected_language_probability=0.8)
    out = joined(first, [(90.0, en), (60.0, fr)], 120.0)
    assert (out.detected_language, out.language_mismatch, out.text) == ("fr", True, "bonjour hello")


def test_a_part_goes_with_its_files_windows_and_the_file_keeps_its_length():
    """Windows leave out long quiet stretches (``worker.windows.window_cuts``), so a part's
    helper must not cut its audio again: the part carries the file's windows, from its start."""
    gaps = ((0, 10 * SR), *(((60 + 10 * i) * SR, (70 + 10 * i) * SR) for i in range(5)))  # 50 s left out after 10 s
    pcm = (np.arange(120 * SR) % 30_000).astype(np.int16)
    p = Prepared(TranscriptionRequest(audio=b""), pcm, gaps, silent=(False,) * 6, samples=len(pcm))
    out = spread(p, parts=2, min_part_s=30, stretch_s=0.0)
    # 60 s to decode: the even split is after 30 s of windows (the third window's end, at 80 s),
    # not at the file's middle (55 s: after the second, 20 s against 40 s).
    (part,) = out.remote
    assert (part.start, part.end) == (80 * SR, 110 * SR) and out.cuts == gaps[:3]
    assert part.cuts == ((0, 10 * SR), (10 * SR, 20 * SR), (20 * SR, 30 * SR))
    assert np.array_equal(pcm16_wav(part.wav), pcm[80 * SR: 110 * SR])
    assert out.duration_s == 120.0  # the quiet end left out of the windows still counts
    assert spread(p, parts=2, min_part_s=31, stretch_s=0.0) is p  # 60 s to decode: under two parts of 31 s


def test_windows_given_with_a_part_are_checked_against_its_audio():
    wav = wav_file(np.ones(SR * 40, np.int16))
    ok = prepare_audio(TranscriptionRequest(audio=wav), None, cuts=((0, SR), (5 * SR, 35 * SR)))
    assert ok.cuts == ((0, SR), (5 * SR, 35 * SR)) and ok.duration_s == 40.0
    with pytest.raises(BadInputError, match="past the audio's 640000 samples"):
        prepare_audio(TranscriptionRequest(audio=wav), None, cuts=((0, 41 * SR),))
    with pytest.raises(BadInputError, match="longer than Whisper's 30 s"):
        prepare_audio(TranscriptionRequest(audio=wav), None, cuts=((0, 31 * SR),))
    # Found by adversarial testing: 1,000 one-sample windows of 2 s of audio kept a replica
    # decoding for minutes (each window a whole encoder pass). window_cuts gives at most one
    # window per second of audio, and one more.
    many = tuple((i, i + 1) for i in range(42))
    with pytest.raises(BadInputError, match=r"42 windows given for 40\.0 s of audio"):
        prepare_audio(TranscriptionRequest(audio=wav), None, cuts=many)
    assert len(prepare_audio(TranscriptionRequest(audio=wav), None, cuts=many[:41]).cuts) == 41


class _Engine:
    """``EngineClient.transcribe`` only: records the options each request was decoded with."""

    dead = False

    def __init__(self) -> None:
        self.options: list = []

    async def transcribe(self, segments, options, on_segment=None):
        self.options.append(options)
        return [WindowResult(text="a", language="en")], 0.01


def test_a_spread_files_parts_decode_with_timestamps_at_the_default_even_a_part_of_one_window():
    # Found in review: the engine decodes a file of several windows with timestamp tokens (Whisper's
    # seek), but a spread file's parts were judged each on its own windows, so a part of one window
    # (parts under ~45 s, with a lowered spread_min_audio_s) decoded without them where the file in
    # one piece would not: not "the same text as on one replica".
    import asyncio
    import json

    from tideserve.metrics.triton import TritonMetrics
    from tideserve.worker.api import WorkerService

    def run(long_form: bool, timestamps: bool) -> tuple[list[bool], list[bool]]:
        engine, sent = _Engine(), []
        service = WorkerService("m", None, engine, TritonMetrics("m"), without_timestamps=None if long_form else True)  # type: ignore[arg-type]
        service.languages = frozenset({"en"})

        async def remote(url, part, options, usage, request_id):
            sent.append(json.loads(options)["timestamps"])
            return TranscriptionResult(text="b", language="en", duration_s=(part.end - part.start) / SR)

        service._remote_part = remote  # type: ignore[method-assign]
        p = spread(_prepared([20, 20]), parts=2, min_part_s=10, stretch_s=0.0)  # two parts of one window each
        p = dataclasses.replace(p, request=TranscriptionRequest(audio=b"", timestamps=timestamps))
        assert len(p.cuts) == 1 and len(p.remote) == 1
        result = asyncio.run(service.transcribe(p, helpers=["http://helper"]))
        assert result.text == "a b"
        return [o.timestamps for o in engine.options], sent

    assert run(long_form=True, timestamps=False) == ([True], [True])
    assert run(long_form=False, timestamps=False) == ([False], [False])  # without_timestamps set: as asked
    assert run(long_form=False, timestamps=True) == ([True], [True])


def test_a_spread_file_is_cut_only_where_a_stretch_begins_and_one_stretch_is_not_cut():
    # Stretches of up to 75 s (windows.stretch_starts): windows 30+30 joined (60 s), the third
    # (20 s) silent alone, then 30+10+30 joined (70 s). A part may end only before a stretch
    # begins: after 60 s or after 80 s. So the helper decodes the same stretches, and writes the
    # same text, as the file in one piece (the engine's stretches begin at a part's start).
    p = _prepared([30, 30, 20, 30, 10, 30])
    out = spread(p, parts=3, min_part_s=10, stretch_s=75.0)
    assert [(r.start / SR, r.end / SR) for r in out.remote] == [(60.0, 80.0), (80.0, 150.0)]
    one = _prepared([30, 30])  # 60 s: one stretch, so one part
    assert spread(one, parts=2, min_part_s=10, stretch_s=75.0) is one
    assert len(spread(one, parts=2, min_part_s=10, stretch_s=0.0).remote) == 1  # windows apart: cut


def test_a_run_up_to_the_stretch_length_is_one_stretch_a_longer_one_is_decoded_window_by_window():
    from tideserve.worker.windows import stretch_starts, window_runs

    s = SR
    cuts = [(0, 30 * s), (30 * s, 50 * s), (50 * s, 80 * s), (81 * s, 90 * s), (90 * s, 95 * s), (95 * s, 99 * s),
            (99 * s, 120 * s)]
    silent = [False, False, False, False, True, False, False]
    # Runs: 0-80 s (three windows), 81-90 s (after a 1 s gap), the silent window, 95-120 s.
    assert window_runs(cuts, silent) == [(0, 3), (3, 4), (4, 5), (5, 7)]
    # The 80 s run is longer than 75 s: each of its windows begins a stretch (apart); 95-120 s
    # (25 s) is one stretch of two windows.
    assert stretch_starts(cuts, silent, 75.0) == [True, True, True, True, True, True, False]
    assert stretch_starts(cuts, silent, 80.0) == [True, False, False, True, True, True, False]  # 80 s: joined
    assert stretch_starts(cuts, silent, 0.0) == [True] * 7
    assert stretch_starts(cuts, [False] * 7, 1000.0) == [True, False, False, True, False, False, False]


def test_a_file_is_cut_into_parts_only_where_each_part_decodes_its_windows_as_the_whole_file():
    from tideserve.worker.windows import decoded_alike, stretch_starts

    # One run of ten 25 s windows (250 s, over 75 s: decoded window by window). Found by the
    # reviewer: cut nearest the even split (83 and 167 s) after 100 and 150 s, the middle part
    # (two windows, 50 s) was joined into one stretch on its helper. A piece of 75 s or less of
    # the run is never a part now: 0-100 s and 100-250 s.
    ten = dataclasses.replace(_prepared([25] * 10), silent=(False,) * 10)
    out = spread(ten, parts=3, min_part_s=60, stretch_s=75.0)
    assert [(r.start / SR, r.end / SR) for r in out.remote] == [(100.0, 250.0)]
    cuts, silent = ten.cuts, ten.silent
    assert not decoded_alike(cuts, silent, 75.0, 4, 6) and decoded_alike(cuts, silent, 75.0, 4, 5)  # one window: alike
    assert decoded_alike(cuts, silent, 0.0, 4, 6)  # windows apart: any piece
    # Random files (windows of 1-30 s, gaps, silent windows), 2-8 parts: each part's stretches,
    # taken alone, are the whole file's.
    rng = np.random.default_rng(7)
    spread_files = 0
    for _ in range(400):
        lengths = rng.integers(1, 31, rng.integers(2, 16)) * SR
        gaps = np.where(rng.random(len(lengths)) < 0.15, 3 * SR, 0)
        starts = np.cumsum(np.concatenate([[0], lengths[:-1] + gaps[1:]]))
        p = Prepared(TranscriptionRequest(audio=b""), np.zeros(int(starts[-1] + lengths[-1]), np.int16),
                     tuple((int(a), int(a + n)) for a, n in zip(starts, lengths, strict=True)),
                     silent=tuple(bool(x) for x in rng.random(len(lengths)) < 0.1))
        max_s = float(rng.choice([0.0, 60.0, 75.0]))
        out = spread(p, parts=int(rng.integers(2, 9)), min_part_s=float(rng.integers(10, 60)), stretch_s=max_s)
        whole = stretch_starts(p.cuts, p.silent, max_s, SR)
        bounds = [0, len(out.cuts)] + [p.cuts.index((r.start + c[0], r.start + c[1])) + len(r.cuts)
                                      for r in out.remote for c in r.cuts[:1]]
        spread_files += bool(out.remote)
        for first, end in itertools.pairwise(sorted(set(bounds))):
            assert stretch_starts(p.cuts[first:end], p.silent[first:end], max_s, SR) == whole[first:end]
    assert spread_files > 100