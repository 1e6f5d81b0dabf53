"""Split audio longer than Whisper's 30 s input window into windows at quiet points.

Whisper's encoder takes a fixed 30 s window (3000 mel frames). Longer audio is cut into windows
of at most 30 s. Each cut goes in the middle of the *longest* quiet run in the last ``search_s``
seconds before the 30 s limit: 100 ms frames whose RMS level is within ``QUIET_ABOVE_MIN_DB`` of
the quietest frame there, or under ``QUIET_FLOOR_DBFS``. The longest pause is where a sentence
ends; the quietest single frame (the rule before) was often a short pause between two words of
one phrase, and a cut there lost words (bench/accuracy.py; README "Accuracy"). The windows of
one file are then decoded side by side, or, in a run of up to ``STRETCH_S``, joined into a stretch.

Long quiet stretches are left out first (``window_cuts``): Whisper placed speech that followed
many seconds of silence in its window at the wrong time (a clip at 60-63 s after a minute of
silence came back at 52-59 s) and wrote text into long room noise ("." after "."). Each quiet run
of 2 s or more is left out but for 0.4 s next to the sound on either side (faster-whisper's VAD
defaults), and no window holds one: the sound between two such runs is cut into windows of its
own, whose times are the file's. A level rule finds the quiet (``sound_spans``), so the cut needs
no model. Its levels, and a rest's measure of speech (``sound_s``), are taken in the speech band
(``band_rms``: a hum, a DC offset or rumble is not speech); the cut's pause search
(``pause_middle``, also the loop split's) keeps levels over the whole band, as A/B-tested
before. Tried and not taken: the kept audio end to end (as faster-whisper's ``transcribe``
does with ``vad_filter``), times mapped back: fewer decodes and the speech on both sides of a
pause in one window, but Whisper then wrote one segment over speech on both sides of a long
pause (bench/quiet_spans_ab.py; README "Accuracy").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WINDOW_S = 30.0
SAMPLE_RATE = 16_000
#: A *run* of a request's windows (contiguous, none silent: ``window_runs``) that decodes with
#: timestamps and lasts at most this many seconds is joined into one *stretch*
#: (``stretch_starts``), decoded as openai/whisper's ``transcribe`` decodes a file: a 30 s window
#: from the start, each next window from the last one's seek point (its last timestamp) or, when
#: it was done, from its end (``worker.engine``). A longer run is decoded window by window, side by
#: side, each window from the prep's cut at a pause, a seek's rest over the window's own encoder
#: output (``longform``). Why both (README, Accuracy: "Runs"): decoded window by window, tiny.en's
#: greedy reading of a counting clip turned on where its window began, and the torch backend
#: (fp32) missed one word of the 1-minute file at beam 1 (WER 0.017 against transcribe's 0.000),
#: which as one stretch writes 0.000; but on longer runs a stretch's windows begin at seek points
#: inside speech, and on eight 4-minute files (bench/accuracy.py --seeds, 2026-12-07) stretches
#: of up to 75 s wrote more errors than windows decoded apart: summed WER 0.074 against 0.0032 at
#: beam 5 and 0.098 against 0.020 at beam 1 (faster-whisper), over ``transcribe``'s on 4 files
#: against 1 at beam 5 and on 3 / 2 against 2 / 1 at beam 1 (faster-whisper / torch); and the
#: 20-minute file ran faster apart (its windows no longer wait for each other in a stretch).
STRETCH_S = 75.0


def window_runs(cuts: Sequence[tuple[int, int]], silent: Sequence[bool]) -> list[tuple[int, int]]:
    """The runs of ``cuts`` (``(start, end)`` sample indices in order; ``silent``: digital silence,
    answered without the model) as ``[first, end)`` window indices, in order, covering every
    window: a window belongs to the run before it when neither is silent and it follows it
    without a gap; a silent window is a run of its own."""
    out: list[tuple[int, int]] = []
    for i, (a, _) in enumerate(cuts):
        if i > 0 and not silent[i] and not silent[i - 1] and a == cuts[i - 1][1]:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def stretch_starts(cuts: Sequence[tuple[int, int]], silent: Sequence[bool], max_s: float,
                   sample_rate: int = SAMPLE_RATE) -> list[bool]:
    """Per window (``cuts``, ``silent`` as ``window_runs`` takes them), whether it begins a stretch
    (``STRETCH_S``): the first window of every run, and every window of a run longer than
    ``max_s`` seconds; ``max_s`` 0: every window. Deterministic."""
    out = [True] * len(cuts)
    for first, end in window_runs(cuts, silent):
        if 0 < cuts[end - 1][1] - cuts[first][0] <= max_s * sample_rate:
            out[first + 1:end] = [False] * (end - first - 1)
    return out


def decoded_alike(cuts: Sequence[tuple[int, int]], silent: Sequence[bool], max_s: float, first: int, end: int,
                  whole: Sequence[bool] | None = None, sample_rate: int = SAMPLE_RATE) -> bool:
    """Whether windows ``first`` to ``end`` (exclusive) of a file (``cuts``, ``silent`` as
    ``window_runs`` takes them), taken as a file of their own (a part of a spread file,
    ``worker.prep.spread``), begin the same stretches as in the whole file (``whole``: its
    ``stretch_starts``, computed when None). Not so when the part leaves a piece of a run decoded
    window by window that lasts ``max_s`` or less: the part would join it into one stretch."""
    if whole is None:
        whole = stretch_starts(cuts, silent, max_s, sample_rate)
    return stretch_starts(cuts[first:end], silent[first:end], max_s, sample_rate) == list(whole[first:end])


@dataclass(frozen=True)
class Window:
    """A slice of a file's samples: ``samples`` (16 kHz mono float32) start at ``offset_s``."""

    samples: np.ndarray
    offset_s: float


def split_windows(
    samples: np.ndarray, sample_rate: int = 16_000, window_s: float = WINDOW_S, search_s: float = 8.0
) -> list[Window]:
    """Cut ``samples`` (shape (n,), int16 PCM or float in [-1, 1]) into windows of at most
    ``window_s`` seconds, each cut in the middle of the longest quiet run (see the module doc).

    Returns at least one window; windows cover the input exactly, in order, without overlap.
    """
    limit = int(window_s * sample_rate)
    out: list[Window] = []
    start, n = 0, len(samples)
    while n - start > limit:
        lo = start + limit - int(search_s * sample_rate)
        cut = lo + pause_middle(samples[lo : start + limit], sample_rate)
        out.append(Window(samples[start:cut], start / sample_rate))
        start = cut
    out.append(Window(samples[start:], start / sample_rate))
    return out


def window_cuts(samples: np.ndarray, sample_rate: int = 16_000) -> list[tuple[int, int]]:
    """The windows to decode of ``samples`` (shape (n,), int16 PCM or float in [-1, 1]) as
    ``(start, end)`` sample indices, in order, without overlap: each of its ``sound_spans`` cut
    as ``split_windows`` cuts a file, so no window holds a long quiet run (what is left out
    between them is answered with nothing). Audio without sound (digital silence) is cut whole,
    so that a request always has windows (the engine answers them ""), and so is audio whose
    only sound is shorter than ``MIN_SPEECH_S`` (decoded as before this rule)."""
    out: list[tuple[int, int]] = []
    for a, b in sound_spans(samples, sample_rate) or [(0, len(samples))]:
        for w in split_windows(samples[a:b], sample_rate):
            start = a + round(w.offset_s * sample_rate)
            out.append((start, start + len(w.samples)))
    return out


#: The shortest speech, seconds of sound: Silero VAD's default (``min_speech_duration_ms`` 250,
#: snakers4/silero-vad ``get_speech_timestamps``). Less between two long quiet runs is left out
#: with them (``sound_spans``); a rest after a seek must hold this much (``longform``).
MIN_SPEECH_S = 0.25
#: Quiet runs at least this long are left out of the windows: faster-whisper's VAD default
#: (``VadOptions.min_silence_duration_ms`` 2000, used by ``transcribe(vad_filter=True)``)...
SKIP_QUIET_S = 2.0
#: ...all but this much of them next to the sound on either side (``VadOptions.speech_pad_ms`` 400).
QUIET_PAD_S = 0.4


def sound_spans(samples: np.ndarray, sample_rate: int = 16_000) -> list[tuple[int, int]]:
    """The parts of ``samples`` (shape (n,), int16 PCM or float in [-1, 1]) to decode, as
    ``(start, end)`` sample indices in order: all of it but each quiet run of at least
    ``SKIP_QUIET_S``, of which ``QUIET_PAD_S`` stays at either end (next to the sound; none is kept
    at the start or end of the audio). A 100 ms frame is quiet at or under the audio's
    ``quiet_level`` (within ``QUIET_ABOVE_MIN_DB`` of its quietest second, and never within
    ``SPEECH_RANGE_DB`` of its loudest second; digital zeros are always quiet), levels measured in
    the speech band (``band_rms``). Both are relative to the audio itself: speech is left out only
    at its own noise floor. A span with less than ``MIN_SPEECH_S`` of
    sound (whole frames) is left out too. Empty when every frame is quiet (digital silence) or
    no span holds that much sound; the whole audio when it is shorter than one frame.
    Deterministic.

    Found by adversarial testing, each a sentence left out as quiet: with the pause rule's level
    (``quiet_level_db``: the quietest *frame* + 10 dB, or -50 dBFS) and a guard of 30 dB under the
    loudest *frame*, one 1 ms click put the guard above -50 dBFS in a file of speech at -45 dBFS
    peak; with the loudest second as the guard, 0.7 s of a tone at -10 dBFS, or speech at -15
    dBFS, did the same to speech at -55 to -60 dBFS peak between digital silence: the -50 dBFS
    floor, not the file's own quiet, had called it quiet. With broadband levels, a mains hum at
    -44 dBFS beside speech at -5 dBFS left out speech at -41 dBFS over the hum, which the model
    heard (and a DC offset of 1% of full scale, or brown noise at -50 dBFS, kept 20 s quiet
    stretches in, so speech after them was timed from the window's start)."""
    frame = max(1, sample_rate // 10)
    rms = band_rms(samples, frame, sample_rate)
    n = len(samples)
    if len(rms) == 0:
        return [(0, n)]
    quiet = rms <= 10.0 ** (quiet_level(_db(rms)) / 20.0)
    skip, pad = round(SKIP_QUIET_S * sample_rate), round(QUIET_PAD_S * sample_rate)
    spans: list[tuple[int, int]] = []
    start = 0  # where the next span begins
    for first, length in _runs(quiet):
        a = first * frame
        b = n if first + length == len(rms) else (first + length) * frame  # the partial last frame goes with the last
        if b - a < skip:
            continue
        lo, hi = (a if a == 0 else a + pad), (b if b == n else b - pad)
        if lo > start:
            spans.append((start, lo))
        start = hi
    if start < n:
        spans.append((start, n))
    # A click or a knock between long quiet runs is left out with them: decoded alone it came back
    # as "." and was the first window with sound, where the language is identified.
    return [(a, b) for a, b in spans if np.count_nonzero(~quiet[a // frame: -(-b // frame)]) * frame
            >= MIN_SPEECH_S * sample_rate]


def frame_rms(samples: np.ndarray, frame: int) -> np.ndarray:
    """RMS level of each whole ``frame``-sample frame of ``samples`` (int16 PCM or float in
    [-1, 1]), on the float scale (full scale 1.0); shape ``(len(samples) // frame,)``."""
    scale = 1.0 / 32768.0 if samples.dtype == np.int16 else 1.0
    n = len(samples) // frame
    x = samples[: n * frame].astype(np.float32) * scale  # int16 squared would overflow
    return np.sqrt(np.mean(x.reshape(n, frame) ** 2, axis=1))


#: The band speech is measured in, Hz: the telephone band (300-3400 Hz, ITU-T G.712) to 4 kHz.
#: Below it lie a mains hum (50/60 Hz and its first harmonics), a DC offset and most of the
#: energy of brown (rumble) noise, which the model does not hear as speech.
SPEECH_BAND_HZ = (300.0, 4000.0)
#: Taps of the speech band's FIR filter (``speech_band``): a Blackman-windowed sinc band-pass,
#: stopband about 74 dB down, transition about 5.5 * 16000 / 511 = 170 Hz wide at 16 kHz.
BAND_TAPS = 511
#: The FFT length of ``speech_band``'s overlap-add (a power of two: fast); each block filters
#: this less ``BAND_TAPS - 1`` samples (bounds its memory).
_BAND_FFT = 1 << 16


@functools.lru_cache(maxsize=4)
def _band_spectrum(sample_rate: int) -> np.ndarray:
    """The real FFT (``_BAND_FFT`` points, read-only) of the FIR band-pass of ``SPEECH_BAND_HZ``:
    the difference of two windowed-sinc low-passes (the standard windowed-sinc design),
    ``BAND_TAPS`` taps, unit gain in the band. Computed once per sample rate (every window's
    levels use it)."""
    n = np.arange(BAND_TAPS) - (BAND_TAPS - 1) / 2
    lo, hi = (f / sample_rate for f in SPEECH_BAND_HZ)
    kernel = (2 * hi * np.sinc(2 * hi * n) - 2 * lo * np.sinc(2 * lo * n)) * np.blackman(BAND_TAPS)
    spectrum = np.fft.rfft(kernel.astype(np.float32), _BAND_FFT)
    spectrum.flags.writeable = False
    return spectrum


def speech_band(samples: np.ndarray, sample_rate: int = 16_000) -> np.ndarray:
    """``samples`` (shape (n,), int16 PCM or float in [-1, 1]) filtered to ``SPEECH_BAND_HZ``,
    float32 on the float scale (full scale 1.0), shape (n,), aligned with the input (the
    filter's delay removed; its first and last ``BAND_TAPS // 2`` samples see the audio's edge).
    By FFT overlap-add in blocks of ``_BAND_FFT - BAND_TAPS + 1`` samples, so the memory does
    not grow with the file (what lies below the band: ``SPEECH_BAND_HZ``)."""
    scale = 1.0 / 32768.0 if samples.dtype == np.int16 else 1.0
    n = len(samples)
    size, step = _BAND_FFT, _BAND_FFT - BAND_TAPS + 1
    spectrum = _band_spectrum(sample_rate)
    full = np.zeros(n + BAND_TAPS - 1, np.float32)
    for start in range(0, n, step):
        block = samples[start: start + step].astype(np.float32) * scale
        out = np.fft.irfft(np.fft.rfft(block, size) * spectrum, size)[: len(block) + BAND_TAPS - 1]
        full[start: start + len(out)] += out.astype(np.float32)
    delay = (BAND_TAPS - 1) // 2
    return full[delay: delay + n]


def band_rms(samples: np.ndarray, frame: int, sample_rate: int = 16_000) -> np.ndarray:
    """RMS level of each whole ``frame``-sample frame of ``samples`` (int16 PCM or float in
    [-1, 1]) in ``SPEECH_BAND_HZ`` (``frame_rms`` of ``speech_band``), on the float scale; shape
    ``(len(samples) // frame,)``. One filter for every frame length, so 20 ms and 100 ms frames
    read a steady sound alike. A first version took each frame's FFT: a 60 Hz hum, 1.2 cycles
    in a 20 ms frame, spilled into the band (-61 dBFS from -44) while 100 ms frames (6 whole
    cycles) read nothing, so ``sound_s`` counted 10 s of hum alone as 10 s of sound (found in
    review). Levels under ``BAND_FLOOR`` read 0, so digital silence stays digital silence."""
    rms = frame_rms(speech_band(samples, sample_rate), frame)
    rms[rms < BAND_FLOOR] = 0.0
    return rms


#: Band levels under this (full scale 1.0: -120 dBFS) read 0 (``band_rms``): under 16-bit audio's
#: quantisation floor (about -101 dBFS), where the rounding of the filter's FFTs lies (about -160
#: dBFS beside speech at -20 in the same block); digital zeros would otherwise read as sound
#: against a quiet level of zeros + 10 dB.
BAND_FLOOR = 1e-6


def pause_middle(region: np.ndarray, sample_rate: int = 16_000) -> int:
    """The sample index in ``region`` (int16 PCM or float in [-1, 1], at least one 100 ms frame)
    at the middle of its longest quiet run (see the module doc)."""
    frame = max(1, sample_rate // 10)
    level_db = _db(frame_rms(region, frame))
    first, length = _longest_run(level_db <= quiet_level_db(level_db))
    return (2 * first + length) * frame // 2


def _db(rms: np.ndarray) -> np.ndarray:
    """RMS levels (full scale 1.0) in dBFS, digital silence at -200."""
    return 20.0 * np.log10(np.maximum(rms, 1e-10))


def quiet_level_db(level_db: np.ndarray) -> float:
    """The pause rule's quiet level, dBFS, of 100 ms frame levels ``level_db`` (non-empty): within
    ``QUIET_ABOVE_MIN_DB`` of the quietest frame, or ``QUIET_FLOOR_DBFS`` if higher."""
    return max(float(level_db.min()) + QUIET_ABOVE_MIN_DB, QUIET_FLOOR_DBFS)


def sound_s(samples: np.ndarray, reference: np.ndarray, sample_rate: int = 16_000) -> float:
    """Seconds of ``samples`` louder than the ``quiet_level`` of ``reference``: the number of
    whole 20 ms frames of ``samples`` whose RMS in the speech band (``band_rms``) is over that
    level, times 0.02 s (a partial last frame is not counted; digital zeros are always quiet;
    the band filter's 16 ms ring past an edge can add a frame at either end of a sound). Both arrays are mono, shape ``(n,)``,
    at ``sample_rate``, int16 PCM or float in [-1, 1]; ``samples`` is usually a slice of
    ``reference`` (a window). In a reference without a pause (its quietest second is soft
    speech) soft speech still counts as sound, by the level's 30 dB range. A reference shorter
    than 100 ms counts every frame as sound.

    The same quiet as ``sound_spans``'. Before, this measure took the pause rule's level (the
    quietest *frame* + 10 dB, or -50 dBFS) under a guard of 30 dB below the loudest *frame*: in
    a window of speech at -55 dBFS peak between digital silence, one click put the guard over
    -50 dBFS, every frame of the speech counted as quiet, and a rest after a seek holding it
    would not have been decoded (found in review of ``sound_spans``' adversarial fixes)."""
    hop = max(1, sample_rate // 50)
    frames = band_rms(samples, hop, sample_rate)
    if len(frames) == 0:
        return 0.0
    ref = band_rms(reference, max(1, sample_rate // 10), sample_rate)
    if len(ref) == 0:
        return len(frames) * hop / sample_rate
    limit = 10.0 ** (quiet_level(_db(ref)) / 20.0)
    return int(np.count_nonzero(frames > limit)) * hop / sample_rate


def quiet_level(level_db: np.ndarray) -> float:
    """The level, dBFS, at or under which a frame of some audio is quiet, given the audio's 100 ms
    frame levels ``level_db`` (dBFS, non-empty): ``QUIET_ABOVE_MIN_DB`` over its quietest second,
    but never within ``SPEECH_RANGE_DB`` of its loudest second (``sustained_db``). Relative to the
    audio alone, with no absolute floor, so neither a click nor a short loud burst moves it.
    The one quiet of ``sound_spans`` (long quiet stretches) and ``sound_s`` (a rest's speech);
    the cut's pause search (``pause_middle``) keeps the pause rule, ``quiet_level_db``."""
    quietest, loudest = sustained_db(level_db)
    return min(quietest + QUIET_ABOVE_MIN_DB, loudest - SPEECH_RANGE_DB)


#: Frames of 100 ms in the running median of ``sustained_db``: a second.
SUSTAIN_FRAMES = 10


def sustained_db(level_db: np.ndarray) -> tuple[float, float]:
    """The quietest and the loudest level, dBFS, each held for about a second, of 100 ms frame
    levels ``level_db`` (non-empty): the lowest and highest running median over
    ``SUSTAIN_FRAMES`` frames (over all of them when there are fewer). A click, a burst or a
    short dip does not move them, where the loudest or quietest single frame would be its."""
    k = min(SUSTAIN_FRAMES, len(level_db))
    medians = np.median(np.lib.stride_tricks.sliding_window_view(level_db, k), axis=1)
    return float(medians.min()), float(medians.max())


#: A frame is quiet within this many dB of the quietest frame of the search region (the pause
#: rule, ``quiet_level_db``) or of the audio's quietest second (``quiet_level``)...
QUIET_ABOVE_MIN_DB = 10.0
#: ...and, in the pause rule only, under this level (dBFS), whatever the quietest frame.
QUIET_FLOOR_DBFS = -50.0
#: The dynamic range of speech, dB: ANSI S3.5-1997 (the speech intelligibility index) takes speech
#: levels over a 30 dB range (15 dB either side of the long-term level); ``quiet_level`` counts it
#: down from the loudest second and never calls a frame within it quiet.
SPEECH_RANGE_DB = 30.0


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """``(first index, length)`` of each run of True in ``flags``, in order."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _longest_run(flags: np.ndarray) -> tuple[int, int]:
    """``(first index, length)`` of the longest run of True in ``flags`` (ties: the latest run,
    which gives the longer window). ``flags`` holds at least one True."""
    return max(reversed(_runs(flags)), key=lambda run: run[1], default=(0, 0))


def windows_of(pcm: np.ndarray, cuts: Sequence[tuple[int, int]], silent: Sequence[bool | None] = ()
               ) -> list[tuple[np.ndarray, float, bool | None]]:
    """The windows of one int16 16 kHz array as ``(pcm view, offset_s, silent)`` (what
    ``worker.engine.EngineLoop.submit`` takes): ``cuts`` are ``(start, end)`` sample indices,
    ``silent`` a flag per window (digital silence) or empty when not judged (then None each).
    Views, no copy. Raises ValueError when ``silent`` is given with another length than ``cuts``."""
    flags: Sequence[bool | None] = tuple(silent) or (None,) * len(cuts)
    return [(pcm[a:b], a / SAMPLE_RATE, f) for (a, b), f in zip(cuts, flags, strict=True)]
