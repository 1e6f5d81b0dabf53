"""Whisper's long-form rules, pure: the seek point from timestamp tokens (a window is never
decoded twice from the same point), silence, and the temperature fallback."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tideserve.protocol.types import Segment
from tideserve.spec.models import Decoding
from tideserve.worker.backends.base import Resume, WindowResult, WindowTask
from tideserve.worker.backends.whisper_text import loop_point, seek_point, window_result
from tideserve.worker.longform import (Accept, Retry, Split, follow_up, repeats_tail, resumed_rest_holds,
                                       says_a_phrase_twice, without_loops)

TB = 1000  # timestamp_begin in these token lists; <|t|> = TB + t / 0.02
EOT = 999


def ts(seconds: float) -> int:
    return TB + round(seconds / 0.02)


def decode(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


def test_seek_point_follows_whisper() -> None:
    assert seek_point([ts(0), 1, 2, ts(3)], TB) is None  # "text <|t|>": done
    assert seek_point([ts(0), 1, 2], TB) is None  # no completed pair: one segment, done
    # Two segments, then unfinished text: seek to the end of the last completed segment.
    toks = [ts(0), 1, ts(3), ts(3), 2, ts(7), ts(7), 3, 4]
    assert seek_point(toks, TB) == (6, pytest.approx(7.0))


def test_a_last_pair_at_zero_is_no_seek_so_the_window_is_decoded_once() -> None:
    # Before: a prompt matching the audio gave "<|0.00|> HELLO WORLD! <|0.00|><|0.00|>"-like output, the
    # window was taken as unfinished from 0.0 s and decoded again: the text came back twice.
    task = WindowTask(np.zeros(16_000 * 2, np.int16), timestamps=True)
    r = window_result(task, [ts(0), 5, 6, ts(0), ts(0)], "en", -0.1, 0.01, EOT, TB, decode)
    assert r.unfinished_from_s is None and r.text == "w5 w6"


def test_unfinished_window_drops_the_text_after_its_last_segment() -> None:
    task = WindowTask(np.zeros(16_000 * 20, np.int16), offset_s=30.0, timestamps=True)
    r = window_result(task, [ts(0), 5, ts(4), ts(4), 6, 7], "en", -0.1, 0.01, EOT, TB, decode)
    assert r.unfinished_from_s == pytest.approx(4.0)
    assert r.text == "w5" and [(s.start_s, s.end_s, s.text) for s in r.segments] == [(30.0, 34.0, "w5")]


def test_silence_is_empty_and_not_a_fallback() -> None:
    task = WindowTask(np.zeros(16_000 * 10, np.int16))
    r = window_result(task, [7], "en", -1.5, 0.9, EOT, TB, decode)
    assert r.silent and r.text == ""
    assert isinstance(follow_up([r], Decoding(beam_size=1)), Accept)


def attempt(t: float, cr: float = 1.2, lp: float = -0.3, unfinished: float | None = None) -> WindowResult:
    return WindowResult(text=f"t{t}", language="en", compression_ratio=cr, avg_logprob=lp, temperature=t,
                        unfinished_from_s=unfinished)


def test_fallback_on_repetition_or_low_confidence_then_accept() -> None:
    d = Decoding(beam_size=1, temperatures=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert follow_up([attempt(0.0, cr=3.1)], d) == Retry(0.2)
    assert follow_up([attempt(0.0), attempt(0.2, lp=-1.4)], d) == Retry(0.4)
    assert follow_up([attempt(0.0, cr=3.1), attempt(0.2, unfinished=9.0)], d) == Accept(attempt(0.2, unfinished=9.0), 9.0)


def test_when_every_temperature_fails_the_best_fitting_attempt_is_kept() -> None:
    d = Decoding(beam_size=1, temperatures=[0.0, 0.5, 1.0])
    tries = [attempt(0.0, cr=4.0, lp=-0.1), attempt(0.5, lp=-1.6), attempt(1.0, lp=-1.2)]
    assert follow_up(tries, d) == Accept(tries[2], None)  # best log-prob under the ratio limit
    assert follow_up([attempt(0.0, cr=3.0), attempt(0.5, cr=3.5), attempt(1.0, cr=2.9)], d).result.temperature == 1.0


def test_fallback_is_off_by_default() -> None:
    assert Decoding().temperatures == [0.0]
    assert follow_up([attempt(0.0, cr=3.1)], Decoding(beam_size=1)) == Accept(attempt(0.0, cr=3.1), None)


def test_temperatures_must_rise() -> None:
    with pytest.raises(ValueError, match="must rise strictly"):
        Decoding(temperatures=[0.0, 0.4, 0.2])


def test_repetition_guard_keeps_the_first_of_a_looping_segment_and_seeks_after_it() -> None:
    """Found with bench/accuracy.py (tiny.en, beam 5, fallback off): a 27 s window came back as
    "1, 2, ..., 10." ten times, one second apart, in place of the speech it held. The guard keeps
    the first of the repeated segments and decodes the audio after it again."""
    loop = [ts(0), 7, 8, ts(1)] + [x for k in range(1, 10) for x in (ts(k), 1, 2, 3, ts(k + 1))]
    assert loop_point(loop, TB) == (9, pytest.approx(2.0))  # "w7 w8", then "w1 w2 w3" once, seek to 2 s
    assert loop_point([ts(0), 1, ts(1), ts(1), 1, ts(2), ts(2), 2, ts(3)], TB) is None  # twice is no loop
    task = WindowTask(np.full(16_000 * 27, 100, np.int16), offset_s=30.0, timestamps=True)
    r = window_result(task, loop, "en", -0.2, 0.01, EOT, TB, decode, compression_ratio_threshold=2.4)
    assert r.compression_ratio > 2.4
    assert r.unfinished_from_s == pytest.approx(2.0) and r.text == "w7 w8 w1 w2 w3"
    assert [(s.start_s, s.end_s) for s in r.segments] == [(30.0, 31.0), (31.0, 32.0)]
    # Without the threshold (or under it) the loop is left to the fallback rule, as before.
    plain = window_result(task, loop, "en", -0.2, 0.01, EOT, TB, decode)
    assert plain.unfinished_from_s is None and plain.text.count("w1 w2 w3") == 9


def test_a_kept_decode_that_loops_to_the_window_end_is_split_only_when_allowed() -> None:
    d = Decoding()  # temperatures [0.0]: no fallback; compression threshold 2.4
    looping = WindowResult(text="1, 2, 3, 1, 2, 3", language="en", avg_logprob=-0.1, compression_ratio=7.6,
                           looping_segment=True)
    assert follow_up([looping], d, can_split=True) == Split()
    assert follow_up([looping], d) == Accept(looping, None)  # too short to split, never split: kept
    # Real repeated speech compresses as well as a whole, but no segment of it does: kept.
    repeated = WindowResult(text="hello world. hello world. hello world.", language="en", avg_logprob=-0.1,
                            compression_ratio=3.1)
    assert follow_up([repeated], d, can_split=True) == Accept(repeated, None)
    # Cut by the repetition guard (a seek point) with no looping segment left: accepted, the
    # seek decodes the rest; a looping segment before the seek point is split all the same.
    guarded = WindowResult(text="1, 2, 3", language="en", avg_logprob=-0.1, compression_ratio=7.6, unfinished_from_s=4.0)
    assert follow_up([guarded], d, can_split=True) == Accept(guarded, 4.0)
    kept_loop = WindowResult(text="1, 2, 3, 1, 2, 3", language="en", avg_logprob=-0.1, compression_ratio=7.6,
                             unfinished_from_s=28.0, looping_segment=True)
    assert follow_up([kept_loop], d, can_split=True) == Split()
    # Under the threshold, or silence: never split.
    fine = WindowResult(text="hello", language="en", avg_logprob=-0.1, compression_ratio=1.1)
    assert follow_up([fine], d, can_split=True) == Accept(fine, None)
    # With fallback temperatures the retry comes first; when all fail, the kept attempt decides.
    d2 = Decoding(temperatures=[0.0, 0.5])
    assert follow_up([looping], d2, can_split=True) == Retry(0.5)
    hot = WindowResult(text="x y x y", language="en", avg_logprob=-0.5, compression_ratio=3.0, temperature=0.5,
                       looping_segment=True)
    assert follow_up([looping, hot], d2, can_split=True) == Split()


def test_a_segment_repeating_inside_itself_is_flagged_and_repeated_sentences_are_not() -> None:
    # Whisper writes "<|0.00|> text <|2.00|>": each segment's own text is measured.
    rep = {1: "hello world.", 2: "one, two, three, four, five, six, seven, eight, nine, ten, " * 8}
    dec = lambda ids: " ".join(rep[i] for i in ids if i in rep)  # noqa: E731
    task = WindowTask(np.zeros(16000 * 20, np.float32), timestamps=False)
    sentences = [ts(0), 1, ts(2), ts(2), 1, ts(4), ts(4), 1, ts(6), ts(6), 1, ts(8), ts(8), 1, ts(10)]
    r = window_result(task, sentences, "en", -0.2, 0.0, EOT, TB, dec, compression_ratio_threshold=1.2)
    assert r.compression_ratio > 1.2 and not r.looping_segment
    loop = [ts(0), 2, ts(20)]
    assert window_result(task, loop, "en", -0.2, 0.0, EOT, TB, dec, compression_ratio_threshold=2.4).looping_segment
    # Without timestamp tokens nothing tells one repeated sentence from a loop: never flagged.
    assert not window_result(task, [2], "en", -0.2, 0.0, EOT, TB, dec, compression_ratio_threshold=2.4).looping_segment


def test_a_part_of_a_split_that_still_loops_loses_its_looping_segments() -> None:
    """Found by adversarial testing: 60 s of a pure tone came back as 9 looping segments ("Beep
    beep ...") because the quarters left after two splits still looped and were kept."""
    d = Decoding()
    beep = Segment(30.0, 37.0, "Beep beep beep beep beep beep beep beep beep beep", compression_ratio=5.1)
    real = Segment(37.0, 37.5, "Hi.", compression_ratio=0.6)
    r = WindowResult(text="Beep beep beep beep beep beep beep beep beep beep Hi.", language="en",
                     segments=[beep, real], avg_logprob=-0.3, compression_ratio=4.0,
                     looping_segment=True, loop_free_text="Hi.")
    kept = follow_up([r], d, can_split=False, was_split=True)
    assert isinstance(kept, Accept) and kept.result.text == "Hi." and kept.result.segments == [real]
    assert not kept.result.looping_segment
    assert follow_up([r], d, can_split=True, was_split=True) == Split()  # a split is tried first
    # From the decoded tokens: the looping segment's text is left out of loop_free_text.
    task = WindowTask(np.zeros(16_000 * 8, dtype=np.int16), offset_s=30.0)
    words = {i: f"w{i}" for i in range(1, 10)}
    tokens = [TB, *[1, 2, 3] * 20, TB + 300, TB + 300, 7, 8, TB + 350]
    res = window_result(task, tokens, "en", -0.2, 0.01, EOT, TB,
                        lambda ids: " ".join(words[i] for i in ids), compression_ratio_threshold=2.4)
    assert res.looping_segment and res.loop_free_text == "w7 w8"


def test_a_loop_faster_than_speech_is_dropped_where_its_window_cannot_be_split() -> None:
    """Found: 60 s of room noise at -40 dBFS came back with "I'm going to do a little bit of a
    little bit of ..." (about 700 characters) over its last window, 8 s (too short to split)."""
    d = Decoding()
    loop = Segment(52.0, 57.0, "a little bit of " * 44, compression_ratio=40.0)  # 704 characters in 5 s
    no = Segment(57.0, 60.0, "no, no, no, no, no, no, no, no, no,", compression_ratio=3.0)  # 12 a second
    r = WindowResult(text=f"{loop.text} {no.text}", language="en", segments=[loop, no], avg_logprob=-0.3,
                     compression_ratio=40.0, looping_segment=True, loop_free_text="", fast_loop_free_text=no.text)
    kept = follow_up([r], d, can_split=False, was_split=False)
    # The loop goes; speech that really repeats, at a speaking rate, stays beside it (review).
    assert isinstance(kept, Accept) and kept.result.text == no.text and kept.result.segments == [no]
    slow = replace(r, text=no.text, segments=[no], fast_loop_free_text=None)
    assert follow_up([slow], d, can_split=False, was_split=False) == Accept(slow, None)
    # From the decoded tokens: characters per second of each looping segment's own time.
    task = WindowTask(np.zeros(16_000 * 8, dtype=np.int16), offset_s=52.0)
    words = {1: "a little bit of", 2: "no,"}
    dec = lambda ids: " ".join(words[i] for i in ids)  # noqa: E731
    res = window_result(task, [TB, *[1] * 40, TB + 250, TB + 250, *[2] * 9, TB + 400], "en", -0.2, 0.01, EOT, TB,
                        dec, compression_ratio_threshold=2.4)
    assert res.looping_segment and res.fast_loop_free_text == "no, " * 8 + "no,"
    assert window_result(task, [TB, *[2] * 9, TB + 400], "en", -0.2, 0.01, EOT, TB, dec,
                         compression_ratio_threshold=2.4).fast_loop_free_text is None


def test_text_written_after_the_windows_audio_ends_is_dropped() -> None:
    """Found: room noise at -40 dBFS came back with ". ." segments from 15.47 s on, each ending
    at 12.97 s, where the window's audio ended: their start was read from timestamps in the
    window's padding (the zeros after its audio), their end clamped to the audio."""
    task = WindowTask(np.zeros(round(16_000 * 12.96), dtype=np.int16), offset_s=0.0, timestamps=True)
    tokens = [ts(0), 1, ts(3), ts(3), 2, ts(12.5), ts(12.5), 3, ts(13.4), ts(15.4), 4, ts(18.0), ts(18.0), 5]
    r = window_result(task, tokens, "en", -0.2, 0.01, EOT, TB, decode)
    assert [(s.start_s, s.end_s, s.text) for s in r.segments] == [(0.0, 3.0, "w1"), (3.0, 12.5, "w2"),
                                                                  (12.5, 12.96, "w3")]
    assert r.text == "w1 w2 w3" and r.unfinished_from_s is None  # the window is done: nothing to seek to
    assert all(s.start_s <= s.end_s <= task.duration_s for s in r.segments)


def test_a_rest_holds_speech_from_13_frames_of_sound_and_a_seek_must_be_in_the_window() -> None:
    from tideserve.worker.longform import tail_holds_speech

    rng = np.random.default_rng(3)
    speech = rng.normal(0, 3000, 16_000 * 5).astype(np.int16)
    room = rng.normal(0, 20, 16_000).astype(np.int16)  # about -64 dBFS
    # 0.20 s and 0.22 s of sound, 20 ms frames: 0.24 s and 0.26 s with the band filter's ring
    # (16 ms either side of an edge: a frame more at each)
    for frames, holds in ((10, False), (11, True)):
        window = np.concatenate([speech, room, speech[: frames * 320], room])
        assert tail_holds_speech(window, 5.5) is holds
    assert not tail_holds_speech(speech, 5.0) and not tail_holds_speech(speech, 9.0)  # no rest
    assert not tail_holds_speech(np.zeros(16_000 * 3, np.int16), 1.0)  # digital silence
    with pytest.raises(ValueError, match="seek_s must be >= 0"):
        tail_holds_speech(speech, -1.0)
    # A span with an end: the sound after it does not count.
    window = np.concatenate([speech, room, speech[: 13 * 320], room])  # 0.26 s of sound at 6.0-6.26 s
    assert tail_holds_speech(window, 5.5, end_s=6.5)
    assert not tail_holds_speech(window, 5.5, end_s=6.0)  # ends before the sound
    assert not tail_holds_speech(window, 5.5, end_s=6.1)  # 0.1 s of it
    assert not tail_holds_speech(window, 6.5, end_s=6.0)  # ends before it starts
    assert tail_holds_speech(window, 5.5, end_s=99.0)  # past the window: to its end


def test_a_rest_that_writes_only_the_end_of_the_last_segment_before_it_repeats_it() -> None:
    """Found on the H200 (torch backend, beam 1, the 5-minute file of bench/accuracy_gpu.py): a
    counting clip's segment closed early, and the rest after the seek came back as "78910."."""
    before = WindowResult(text="Hello world. 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.", language="en",
                          unfinished_from_s=20.0, last_segment_text="1, 2, 3, 4, 5, 6, 7, 8, 9, 10.")
    assert repeats_tail(before, WindowResult(text="78910.", language="en", text_end_s=1.0))
    assert repeats_tail(before, WindowResult(text=" 9, 10", language="en", text_end_s=2.0))
    # new speech in the rest, an empty rest, or words of an earlier segment: kept
    assert not repeats_tail(before, WindowResult(text="9, 10. Hello world.", language="en", text_end_s=2.0))
    assert not repeats_tail(before, WindowResult(text="", language="en"))
    assert not repeats_tail(before, WindowResult(text="...", language="en", text_end_s=0.5))
    # found on the 20-minute file with a first version that compared the whole text: new speech
    assert not repeats_tail(before, WindowResult(text="Hello World! 1-2-3-4-5-6-7-8-9-10", language="en",
                                                 text_end_s=5.0))
    # the same words as the segment's end, but over 4.0 s: new speech (bench/accuracy.py, beam 1)
    last = replace(before, last_segment_text="The quick brown fox jumps over the lazy dog. Hello World. 12345678910.")
    assert not repeats_tail(last, WindowResult(text="Hello World. 1-234-567-8910.", language="en", text_end_s=4.0))
    assert repeats_tail(last, WindowResult(text="Hello World. 1-234-567-8910.", language="en", text_end_s=1.9))
    # found in review: the match must start where a word of the segment does
    cat = replace(before, last_segment_text="I saw the cat.")
    assert not repeats_tail(cat, WindowResult(text="At", language="en", text_end_s=1.0))
    assert repeats_tail(cat, WindowResult(text="the cat", language="en", text_end_s=1.0))
    assert not repeats_tail(replace(before, last_segment_text="counted to 10"),
                            WindowResult(text="0.", language="en", text_end_s=1.0))


def test_no_last_segment_text_after_the_repetition_guard_seek_or_removed_loops() -> None:
    """Found in review: speech that really repeats after a loop is the next part's to transcribe
    (``loop_point``), so the repeated-rest rule has nothing to compare it with."""
    task = WindowTask(np.zeros(16_000 * 20, np.int16), timestamps=True)
    loop = [ts(0), 5, 6, ts(2), ts(2), 5, 6, ts(4), ts(4), 5, 6, ts(6), ts(6), 5, 6, ts(8), ts(8), 7]
    r = window_result(task, loop, "en", -0.2, 0.01, EOT, TB, decode, compression_ratio_threshold=1.2)
    assert r.unfinished_from_s is not None and r.last_segment_text == ""
    looped = WindowResult(text="a", language="en", unfinished_from_s=3.0, last_segment_text="b b b b",
                          looping_segment=True, loop_free_text="a")
    assert without_loops(looped, Decoding(beam_size=1)).last_segment_text == ""


def test_a_decode_that_seeks_carries_its_last_segment_text_with_or_without_timestamps() -> None:
    for timestamps in (True, False):
        task = WindowTask(np.zeros(16_000 * 20, np.int16), timestamps=timestamps)
        r = window_result(task, [ts(0), 1, ts(2), ts(2), 2, 3, ts(5), ts(5), 4], "en", -0.1, 0.01, EOT, TB, decode)
        assert r.unfinished_from_s == pytest.approx(5.0) and r.last_segment_text == "w2 w3"
        assert r.text_end_s == pytest.approx(5.0)
    done = window_result(task, [ts(0), 1, ts(2)], "en", -0.1, 0.01, EOT, TB, decode)
    assert done.unfinished_from_s is None and done.last_segment_text == "" and done.text_end_s == pytest.approx(2.0)
    left_open = window_result(task, [ts(0), 1], "en", -0.1, 0.01, EOT, TB, decode)
    assert left_open.text_end_s == pytest.approx(20.0)  # text without a closing timestamp runs to the end


def test_a_resumed_decode_starts_at_its_timestamp_and_seeks_only_past_it() -> None:
    """A rest decoded over its window's kept encoder output (``WindowTask.resume``): its tokens
    begin with the timestamp it resumed at, its times count from the window's start, and a last
    pair at that timestamp is no seek (the same point is never decoded twice)."""
    window = np.zeros(16_000 * 25, np.int16)
    task = WindowTask(window, offset_s=100.0, timestamps=True, resume=Resume(21.0, encoded=None))
    r = window_result(task, [ts(21), 5, ts(23), ts(23), 6], "en", -0.1, 0.01, EOT, TB, decode)
    assert r.unfinished_from_s == pytest.approx(23.0) and r.text == "w5"
    assert [(s.start_s, s.end_s, s.text) for s in r.segments] == [(pytest.approx(121.0), pytest.approx(123.0), "w5")]
    again = window_result(task, [ts(21), ts(21), 5], "en", -0.1, 0.01, EOT, TB, decode)
    assert again.unfinished_from_s is None and again.text == "w5"


def test_a_resumed_rest_repeats_the_segment_before_when_it_ends_within_2_s_of_its_own_start() -> None:
    before = WindowResult(text="1, 2, 3.", language="en", unfinished_from_s=20.0, last_segment_text="1, 2, 3.")
    resumed = WindowResult(text="3.", language="en", text_end_s=21.5)  # times from the window's start
    assert repeats_tail(before, resumed, rest_start_s=20.0)
    assert not repeats_tail(before, resumed)  # read as a rest from its own audio: 21.5 s of it


def test_a_resumed_rest_is_kept_only_when_no_speech_follows_its_last_word() -> None:
    rng = np.random.default_rng(0)
    speech, room = rng.normal(0, 3000, 16_000 * 24).astype(np.int16), rng.normal(0, 20, 16_000).astype(np.int16)
    window = np.concatenate([speech, room])  # 24 s of sound, then 1 s of quiet
    d = Decoding(beam_size=1)
    done = WindowResult(text="dog.", language="en", text_end_s=25.0, last_word_end_s=24.0, avg_logprob=-0.3)
    assert resumed_rest_holds(window, done, d)
    # its segment closed at the window's end, over speech its words do not reach
    assert not resumed_rest_holds(window, replace(done, last_word_end_s=22.0), d)
    assert not resumed_rest_holds(window, replace(done, last_word_end_s=None), d)  # words not placed
    assert not resumed_rest_holds(window, replace(done, text=" "), d)  # wrote nothing
    assert not resumed_rest_holds(window, replace(done, avg_logprob=-1.5), d)  # under Whisper's threshold
    # seeking on: no speech between its last word and its seek point
    assert resumed_rest_holds(window, replace(done, last_word_end_s=11.9, unfinished_from_s=12.0), d)
    assert not resumed_rest_holds(window, replace(done, last_word_end_s=10.0, unfinished_from_s=12.0), d)
    # Adversarial: a resumed rest that writes only the last segment before its seek point again
    # (the model read the window's sentence a second time) is decoded from its own audio instead.
    sought = WindowResult(text="The quick brown fox.", language="en", unfinished_from_s=25.0,
                          last_segment_text="The quick brown fox.")
    again = replace(done, text=" the Quick brown fox")
    assert not resumed_rest_holds(window, again, d, sought=sought)
    assert resumed_rest_holds(window, again, d)  # nothing to compare with
    assert resumed_rest_holds(window, replace(done, text=" The quick brown fox. Hello."), d, sought=sought)
    assert resumed_rest_holds(window, replace(done, text=" ..."), d, sought=replace(sought, last_segment_text=""))
    # Found on bench/accuracy.py's 20-minute file at beam 1: after "Hello World. 1-2-3-4-5-6-7-8-9-10."
    # the rest wrote the count again over 5 s of "The quick brown fox jumps over the lazy dog" (WER
    # 0.0073; decoded from its own audio 0.000). The end of the segment counts, from a word's start.
    counted = replace(sought, text="Hello World. 1-2-3-4-5-6-7-8-9-10.",
                      last_segment_text="Hello World. 1-2-3-4-5-6-7-8-9-10.")
    assert not resumed_rest_holds(window, replace(done, text=" 1, 2, 3, 4, 5, 6, 7, 8, 9, 10."), d, sought=counted)
    hello = WindowResult(text="Hello World.", language="en", last_segment_text="Hello World.")
    assert not resumed_rest_holds(window, replace(done, text=" World."), d, sought=hello)
    assert resumed_rest_holds(window, replace(done, text=" The quick brown fox jumps over the lazy dog."), d,
                              sought=counted)
    assert resumed_rest_holds(window, replace(done, text=" 0."), d, sought=counted)  # "10" ends in 0, not a word


def test_a_resumed_rest_that_says_a_phrase_twice_in_a_row_is_decoded_from_its_own_audio() -> None:
    """bench/accuracy.py's 4-minute file of seed 5 at beam 1: a resumed rest over "The quick brown
    fox jumps over the lazy dog" wrote "The Quick Brown Fox, the Quick Brown Fox," and its
    alignment spread the second "Fox" to the sentence's end, so no sound seemed to follow it (WER
    0.0167; decoded from its own audio the rest reads the sentence, 0.000)."""
    window = np.zeros(16_000 * 25, np.int16)
    d = Decoding(beam_size=1)
    looped = WindowResult(text=" The Quick Brown Fox, the Quick Brown Fox,", language="en", text_end_s=24.5,
                          last_word_end_s=24.4, avg_logprob=-0.3)
    assert not resumed_rest_holds(window, looped, d)
    assert resumed_rest_holds(window, replace(looped, text=" The quick brown fox jumps over the lazy dog."), d)
    assert says_a_phrase_twice("1-2-3-4, 1, 2, 3, 4.")  # case, marks and digits read as words
    assert not says_a_phrase_twice("No, no, that is right.")  # one word twice: real speech, kept
    assert says_a_phrase_twice("No, no, that is right.", min_words=1)
    assert not says_a_phrase_twice("Hello world. The quick brown fox. Hello world.")  # not in a row
    assert not says_a_phrase_twice("")


def test_a_resumed_decode_never_writes_a_time_before_its_start() -> None:
    """Found in review: CTranslate2 keeps sampled timestamps in order among themselves, not after
    the forced one, so a resumed decode may write <|0.00|> after <|21.00|>."""
    task = WindowTask(np.zeros(16_000 * 25, np.int16), offset_s=100.0, timestamps=True,
                      resume=Resume(21.0, encoded=None))
    r = window_result(task, [ts(21), ts(0), 5, ts(3)], "en", -0.1, 0.01, EOT, TB, decode)
    assert [(s.start_s, s.end_s) for s in r.segments] == [(pytest.approx(121.0), pytest.approx(121.0))]
