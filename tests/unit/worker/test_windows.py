from __future__ import annotations

import numpy as np

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
    assert sound_s(tail, window) == 0.06  # the last word's final 60 ms, then quiet
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
