from __future__ import annotations

import numpy as np
import pytest

from tideserve.worker.windows import split_windows

SR = 16_000


def test_short_audio_is_one_window():
    x = np.ones(SR * 5, np.float32)
    (w,) = split_windows(x)
    assert w.offset_s == 0.0 and len(w.samples) == len(x)


def test_long_audio_is_cut_at_the_quiet_point_and_covered_exactly():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 0.3, SR * 70).astype(np.float32)
    x[int(27.0 * SR): int(27.4 * SR)] = 0.0  # a pause 3 s before the 30 s limit
    ws = split_windows(x)
    assert all(len(w.samples) <= 30 * SR for w in ws)
    assert 27.0 <= ws[1].offset_s <= 27.4
    assert np.array_equal(np.concatenate([w.samples for w in ws]), x)
    offsets = [w.offset_s for w in ws]
    assert offsets == sorted(offsets) and len(ws) == 3


def test_no_pause_still_cuts_within_the_limit():
    x = np.ones(SR * 61, np.float32)
    ws = split_windows(x)
    assert len(ws) == 3 and all(len(w.samples) <= 30 * SR for w in ws)


def test_the_cut_goes_in_the_longest_pause_not_the_quietest_frame():
    """Found with bench/accuracy.py: the quietest 100 ms frame was a pause between two counted
    numbers (digital zeros inside a clip), so the cut split a phrase and words were lost; the
    0.8 s gap of low room noise between two sentences is where to cut."""
    rng = np.random.default_rng(1)
    x = rng.normal(0, 0.2, SR * 45).astype(np.float32)
    x[int(24.0 * SR): int(24.8 * SR)] = rng.normal(0, 10 ** (-65 / 20), int(0.8 * SR))  # sentence gap, -65 dBFS
    x[int(28.0 * SR): int(28.2 * SR)] = 0.0  # a short pause between two words: quieter, but short
    ws = split_windows(x)
    assert len(ws) == 2 and abs(ws[1].offset_s - 24.4) <= 0.1, ws[1].offset_s
    pcm = (x * 32767).astype(np.int16)  # the same decision on int16 PCM, as the prep process cuts
    assert abs(split_windows(pcm)[1].offset_s - 24.4) <= 0.1


def test_sound_counts_the_frames_above_the_quiet_level_in_seconds():
    from tideserve.worker.windows import sound_s

    rng = np.random.default_rng(2)
    speech = rng.normal(0, 0.1, SR * 5).astype(np.float32)  # about -20 dBFS
    room = rng.normal(0, 10 ** (-65 / 20), SR).astype(np.float32)  # a pause of room noise
    tail = np.concatenate([speech[: int(0.06 * SR)], room[: int(0.9 * SR)]])
    window = np.concatenate([speech, room, tail])
    assert sound_s(tail, window) == 0.08  # the last word's final 60 ms (and the band filter's 16 ms ring), then quiet
    assert sound_s(room, window) == 0.0
    assert sound_s(speech[: SR // 2], window) == 0.5
    # A window without a pause: its quietest frame is soft speech, yet soft speech is sound
    # (within 30 dB of the loudest frame), while room noise 45 dB under it is not.
    soft = speech[: SR] * 10 ** (-12 / 20)
    no_pause = np.concatenate([speech, soft])
    assert sound_s(soft, no_pause) == 1.0
    assert sound_s(room, no_pause) == 0.0
    assert sound_s(np.zeros(0, np.float32), window) == 0.0
    assert sound_s(speech[:SR], speech[:100]) == 1.0  # a reference under 100 ms: all sound


def _speech(rng: np.random.Generator, seconds: float, dbfs: float = -20.0) -> np.ndarray:
    return rng.normal(0, 10 ** (dbfs / 20), int(seconds * SR)).astype(np.float32)


def test_long_quiet_stretches_are_left_out_of_the_windows_but_the_quiet_next_to_sound():
    """Whisper placed a clip after a minute of silence 8 s early and wrote "." into long room
    noise; quiet runs of 2 s or more are left out, 0.4 s of them kept next to the sound
    (faster-whisper's VAD defaults), and no window holds one."""
    from tideserve.worker.windows import sound_spans, window_cuts

    rng = np.random.default_rng(3)
    room = lambda s: _speech(rng, s, -62.0)  # noqa: E731  room noise
    x = np.concatenate([_speech(rng, 5), np.zeros(60 * SR, np.float32), _speech(rng, 3), room(1.9),
                        _speech(rng, 2), room(10)])
    # speech 0-5 s, zeros 5-65, speech 65-68, room 68-69.9 (under 2 s), speech 69.9-71.9, room to 81.9.
    # Quiet is relative to the file's quietest second, here digital zeros: the room noise is not.
    # (The band filter rings for 16 ms past an edge into digital zeros: one 100 ms frame more.)
    spans = [(a / SR, b / SR) for a, b in sound_spans(x)]
    assert spans == [(0.0, 5.5), (64.5, 81.9)]
    assert [(a / SR, b / SR) for a, b in window_cuts(x)] == spans  # each under 30 s: one window each
    # Without digital zeros, the room noise is the quiet: 2 s or more of it is left out.
    r = np.concatenate([_speech(rng, 5), room(10), _speech(rng, 3), room(1.9), _speech(rng, 2), room(10)])
    assert [(a / SR, b / SR) for a, b in sound_spans(r)] == [(0.0, 5.5), (14.5, 22.4)]
    # Quiet at the very start is left out whole: no pad before the file's start is needed.
    y = np.concatenate([np.zeros(45 * SR, np.float32), _speech(rng, 3)])
    assert [(a / SR, b / SR) for a, b in sound_spans(y)] == [(44.5, 48.0)]
    # A span longer than 30 s is cut as a file is, from its own start.
    z = np.concatenate([np.zeros(10 * SR, np.float32), _speech(rng, 50)])
    cuts = window_cuts(z)
    assert cuts[0][0] == round(9.5 * SR) and cuts[-1][1] == len(z) and len(cuts) == 2
    assert cuts[0][1] - cuts[0][0] <= 30 * SR and cuts[0][1] == cuts[1][0]


def test_soft_speech_is_never_a_quiet_stretch_and_silence_still_gets_windows():
    from tideserve.worker.windows import sound_spans, window_cuts

    rng = np.random.default_rng(4)
    # Speech 25 dB under the loudest frame, 3 s long, between loud speech: not quiet (30 dB range).
    x = np.concatenate([_speech(rng, 4, -15.0), _speech(rng, 3, -40.0), _speech(rng, 4, -15.0)])
    assert sound_spans(x) == [(0, len(x))]
    # Steady noise with nothing louder is sound (no reference to call it quiet against).
    assert sound_spans(_speech(rng, 10, -60.0)) == [(0, 10 * SR)]
    silence = np.zeros(70 * SR, np.int16)
    assert sound_spans(silence) == []
    cuts = window_cuts(silence)  # answered "" by the engine (digital silence), but a request has windows
    assert cuts[0][0] == 0 and cuts[-1][1] == len(silence) and len(cuts) == 3
    assert sound_spans(np.ones(100, np.int16)) == [(0, 100)]  # shorter than one frame: all of it


@pytest.mark.parametrize(("loud", "soft_dbfs", "floor_dbfs"), [
    ("a 1 ms click at 0.9 of full scale", -45, None), ("0.2 s of noise at -3 dBFS", -45, None),
    ("1 s of a tone at -10 dBFS", -60, None), ("3 s of speech at -15 dBFS", -55, None),
    # Over room noise 15 dB under the soft speech's peak: the quietest second + 10 dB would take
    # the soft speech's quieter frames; 30 dB under its loudest second (not the click's) holds them.
    ("a 1 ms click at 0.9 of full scale", -45, -60)])
def test_soft_speech_is_kept_in_a_file_with_something_loud(en_clips, loud, soft_dbfs, floor_dbfs):
    """Found by adversarial testing (two passes): with one click in the file, a sentence at -45
    dBFS peak was left out whole as quiet (the text came back as dots); with 0.7 s or more of a
    tone, or loud speech, one at -55 to -60 dBFS peak between digital silence was too (all 11
    words lost at -60)."""
    from tideserve.worker.windows import sound_s, sound_spans

    rng = np.random.default_rng(6)
    fox = next(c for c in en_clips if c.name == "quick_brown_fox").samples
    soft = fox / np.abs(fox).max() * 10 ** (soft_dbfs / 20)
    lead = np.zeros(5 * SR, np.float32)
    if loud.startswith("a 1 ms click"):
        lead[2 * SR: 2 * SR + 16] = 0.9
    elif loud.startswith("0.2 s of noise"):
        lead[2 * SR: 2 * SR + SR // 5] = rng.normal(0, 10 ** (-3 / 20) / 3, SR // 5)
    elif loud.startswith("1 s of a tone"):
        lead[SR: 2 * SR] = 10 ** (-10 / 20) * np.sin(2 * np.pi * 880 * np.arange(SR) / SR)
    else:
        lead[SR: 4 * SR] = np.resize(fox / np.abs(fox).max() * 10 ** (-15 / 20), 3 * SR)
    x = np.concatenate([lead, soft, np.zeros(5 * SR, np.float32)])
    if floor_dbfs is not None:
        x += rng.normal(0, 10 ** (floor_dbfs / 20), len(x)).astype(np.float32)
    spans = [(a / SR, b / SR) for a, b in sound_spans(x)]
    speech = (5.0 + 0.05, 5.0 + 2.56)  # the clip's sound (it opens and ends with its own quiet)
    assert any(a <= speech[0] and b >= speech[1] for a, b in spans), spans  # the whole sentence kept
    # The same quiet measures a rest's speech after a seek (review: ``sound_s`` kept the frame
    # guard and the -50 dBFS floor, and counted none of this sentence as sound with the click).
    assert sound_s(x[5 * SR: 5 * SR + len(soft)], x) >= 1.5


def test_a_click_between_long_quiet_runs_is_left_out_with_them():
    """Review: a click alone between two long quiet runs became a window of its own, the first
    with sound, where the language is identified (and decoded alone it came back as ".")."""
    from tideserve.worker.windows import sound_spans, window_cuts

    rng = np.random.default_rng(7)
    x = np.zeros(20 * SR, np.float32)
    x[2 * SR: 2 * SR + 16] = 0.9
    speech = _speech(rng, 3)
    assert [(a / SR, b / SR) for a, b in sound_spans(np.concatenate([x, speech]))] == [(19.5, 23.0)]
    # Its only sound shorter than MIN_SPEECH_S: the audio is cut whole, as before the rule.
    assert sound_spans(x) == [] and window_cuts(x) == [(0, 20 * SR)]
    # Three frames of sound (0.3 s) are speech enough (the quiet before them, 1.9 s with the band
    # filter's ring, is under 2 s and stays).
    x[2 * SR: 2 * SR + 3 * SR // 10] = _speech(rng, 0.3)
    assert [(a / SR, b / SR) for a, b in sound_spans(x)] == [(0.0, 2.8)]


def _at_rms(x: np.ndarray, dbfs: float) -> np.ndarray:
    return (x * 10 ** (dbfs / 20) / np.sqrt(np.mean(x.astype(np.float64) ** 2))).astype(np.float32)


def test_levels_are_measured_in_the_speech_band(en_clips):
    """Found by adversarial testing, with broadband levels: over a mains hum (60 and 120 Hz) at
    -44 dBFS, speech at -41 dBFS after speech at -5 dBFS was left out whole (the model hears it:
    faster-whisper transcribed all of it); a DC offset of 1% of full scale, or brown noise at -50
    dBFS, kept 20 s of quiet in the windows, and the speech after it was timed from its start."""
    from tideserve.worker.windows import MIN_SPEECH_S, band_rms, frame_rms, sound_s, sound_spans

    clip = {c.name: c.samples for c in en_clips}
    t = np.arange(SR) / SR
    tone = np.sin(2 * np.pi * 1000 * t).astype(np.float32)
    assert band_rms(tone, SR // 10)[0] == pytest.approx(frame_rms(tone, SR // 10)[0], rel=1e-3)  # in band: the same
    assert band_rms(np.full(SR, 0.5, np.float32), SR // 10)[1:-1].max() < 1e-5  # DC: none (but at its edges)

    loud, soft = _at_rms(clip["quick_brown_fox"], -5), _at_rms(clip["counting"], -41)
    gap = np.zeros(3 * SR, np.float32)
    x = np.concatenate([gap, loud, gap, soft, gap])
    n = np.arange(len(x)) / SR
    hum = np.sin(2 * np.pi * 60 * n) + 0.5 * np.sin(2 * np.pi * 120 * n)
    x = x + _at_rms(hum, -44)
    start = (6 * SR + len(loud)) / SR  # the soft speech, in the file's time
    spans = [(a / SR, b / SR) for a, b in sound_spans(x)]
    assert any(a <= start + 0.1 and b >= start + len(soft) / SR - 0.1 for a, b in spans), spans
    assert sound_s(x[round(start * SR): round(start * SR) + len(soft)], x) >= 1.5
    # Review: the hum alone is no sound at 20 ms as at 100 ms (per-frame FFTs had read a 60 Hz hum,
    # 1.2 cycles in 20 ms, as 10 s of sound in 10 s of it, in 16-bit audio).
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int16)
    assert sound_s(pcm[-2 * SR:], pcm) < MIN_SPEECH_S and sound_s(pcm[: 3 * SR], pcm) < MIN_SPEECH_S

    speech = _at_rms(clip["quick_brown_fox"], -25)
    quiet_then_speech = np.concatenate([np.zeros(20 * SR, np.float32), speech, np.zeros(5 * SR, np.float32)])
    rng = np.random.default_rng(9)
    brown = np.cumsum(rng.standard_normal(len(quiet_then_speech)))
    brown -= np.convolve(brown, np.ones(1601) / 1601, "same")  # no drift: rumble, most of it under 300 Hz
    for floor in (np.full(len(quiet_then_speech), 0.01, np.float32), _at_rms(brown, -50)):
        (a, b), *more = sound_spans(quiet_then_speech + floor)
        assert a / SR >= 19.0 and b / SR <= 23.5 + 0.5 and not more, (a / SR, b / SR, more)
