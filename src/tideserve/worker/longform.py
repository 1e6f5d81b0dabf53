"""Whisper's long-form rules for one window's follow-up, pure: fall back to a higher
temperature, seek to the rest of the window, or accept.

Source: openai/whisper ``transcribe`` (``decode_with_fallback`` and the seek loop) and
faster-whisper's ``generate_with_fallback``:
- a decode *needs fallback* when its gzip compression ratio exceeds ``compression_ratio_threshold``
  (2.4: repetition) or its mean log-probability is under ``log_prob_threshold`` (-1.0), unless
  it is silence (no-speech probability over ``no_speech_threshold`` while under the log-prob
  threshold); it is then decoded again at the next of ``temperatures``;
- when every temperature failed, the attempt kept is the one with the highest mean
  log-probability among those under the compression threshold (faster-whisper), else the last;
- an accepted window that left speech after its last completed segment (``unfinished_from_s``)
  continues from there as a new part (the seek), starting again at the first temperature;
- inside a stretch (``windows.STRETCH_S``: the windows of a short run of speech joined) the rest after a
  seek is not decoded alone: the next window starts at the seek point and runs on into the
  stretch, as ``transcribe``'s do, and the quiet-tail and resumed-rest rules below do not apply
  there; they apply to a rest decoded alone, at the end of a stretch or of a window decoded apart;
- tideserve's addition, the quiet tail: a seek is taken only when the rest of the window holds
  at least ``MIN_SPEECH_S`` of sound (``tail_holds_speech``); otherwise the window is done, and
  the text its decode wrote after the last completed segment, which lies over that rest (dropped
  with the seek, ``whisper_text.window_result``), stays dropped: it was written over no speech.
  ``transcribe`` seeks into a new 30 s window that goes on into the following speech; here the
  rest of the window ends at the next cut, in a pause, so a rest that holds only the last word's final sound and the pause
  (60 ms of sound and 0.9 s of quiet, after a counting clip whose closing timestamp came early)
  was decoded alone, and Whisper wrote "And then we'll see you next time." over it (the beam-1
  5-minute file of bench/accuracy.py: WER 0.020, where ``transcribe`` has 0);
- tideserve's addition, the loop split: a decode kept whose timestamped segments (those before
  its seek point) include one over the compression threshold (a loop the repetition guard could not
  cut: ONE segment repeating inside itself, e.g. "1, 2, ... 10, 1, 2, ... 10, 9, 9, 9" over
  27 s of other speech) is decoded again as two halves cut at the window's longest pause, when
  the engine allows it (``can_split``). Measured on such a window of a 1-minute file: both
  halves came back right (README, Accuracy). Real repeated speech also compresses well as a
  whole, but each of its sentences is a segment of its own; a first version that looked at the
  whole text split it too (491 extra decodes in the H200 bench, without timestamps, and a worse
  text on one file), so a decode without timestamped segments is never split. A part that was
  split before and still loops when it may not be split again (too short, or split twice) loses
  the segments that loop by themselves: a loop that survived two cuts of the audio is taken as one
  the audio does not hold (found by adversarial testing: 60 s of a pure tone came back as 9
  segments of "Beep beep beep ..." where faster-whisper's ``transcribe`` returns nothing). So
  does, in a window too short to split, a looping segment that writes more than
  ``whisper_text.MAX_LOOP_CHARS_PER_S`` characters per second of its audio (faster than anyone
  speaks); a looping segment at a speaking rate beside it stays.

- tideserve's addition, the repeated rest: a rest decoded after a seek whose whole text is the
  end of the last segment the decode before it completed (letters and digits only, case
  ignored, from the start of a word) and ends within ``MAX_REPEAT_S`` of the rest's start is
  dropped (``repeats_tail``); not after the repetition guard's seek, nor after a decode whose
  looping segments were removed.
  The seek starts at that segment's closing timestamp; when it closed early, the rest holds the
  end of speech already written, and decoded alone it is written again: on the H200 (torch
  backend, bf16, beam 1) a counting clip's segment "1-2-3-4-5-6-7-8-9-10." was followed by a
  rest decoded as "78910." (bench/accuracy_gpu.py, the 5-minute file). Hugging Face's chunked
  pipeline merges the overlap of its overlapping chunks for the same reason. Only the last
  segment and a short stretch count: a first version that compared the decode's whole text
  dropped a rest of new speech ("Hello World! 1-2-3-4-5-6-7-8-9-10" after "Hello World.
  12345678910.", bench/accuracy_gpu.py's 20-minute file), and one without the time limit dropped
  "Hello World. 1-234-567-8910." (4.0 s of new speech) after a segment that ended with the same
  two clips (bench/accuracy.py's 20-minute file, beam 1). A rest that also holds new speech is
  kept whole; one that truly repeats the segment's last words within ``MAX_REPEAT_S`` (a speaker
  saying them again right after) is lost.

- tideserve's addition, the resumed rest: a backend that ``resumes`` (faster-whisper) keeps the
  encoder output of a decode that seeks, and the rest is decoded over it, the timestamp token of
  the seek point forced after the prompt, instead of being encoded again from its own audio
  padded to 30 s (``transcribe`` encodes a new window from the seek point). On 2 cores the
  encoder of tiny.en is about half of a window's cost (an int8 batch of 8 windows: 4.4 s on one
  thread), and a rest is mostly padding: on bench/accuracy.py's 20-minute file at beam 5, 24 of
  73 decodes were rests. The resumed decode is kept only when it wrote text, passes Whisper's
  quality thresholds and leaves no speech after its last word (``resumed_rest_holds``);
  otherwise (and when it loops) the rest is decoded from its own audio as before. It is an attempt, not
  Whisper's rule: the model was trained to start at 0 s, and resumed decodes that stopped after
  "The Quick Brown Fox" or closed a segment over the next clip's "Hello world" lost words
  before that check (README, Accuracy).

No clock, no I/O and no model: the engine loop and the tests call the same function.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from collections.abc import Sequence

import numpy as np

from tideserve.spec.models import Decoding
from tideserve.protocol.types import Segment
from tideserve.worker.backends.base import PreviousText, WindowResult
from tideserve.worker.backends.whisper_text import too_fast
from tideserve.worker.windows import MIN_SPEECH_S, sound_s


@dataclass(frozen=True)
class Retry:
    """Decode the same window again at ``temperature``."""

    temperature: float


@dataclass(frozen=True)
class Accept:
    """Keep ``result``; if ``seek_s`` is set, decode the rest of the window from there."""

    result: WindowResult
    seek_s: float | None = None


def decodes_timestamps(asked: bool, windows: int, without_timestamps: bool | None) -> bool:
    """Whether a request decodes with timestamp tokens, before the backend's own rule (which adds
    them everywhere for ``without_timestamps: false``): when its response format asks for them
    (``asked``), or, at the endpoint's default (``without_timestamps`` unset), when the file is cut
    into more than one window (``windows``), whose long-form seek needs them, whatever the format.
    Without them a window whose decode stops early loses the rest of its speech: on
    bench/accuracy.py's 1-minute file (3 windows) WER 0.47 against 0.0 with them, on its 20-minute
    file 0.081 against 0.005 (beam 5, 2 cores, README Accuracy). One rule for the engine (a
    request's own windows) and the worker front (a spread file's parts, which no engine sees whole)."""
    return asked or (windows > 1 and without_timestamps is None)


#: Peak amplitude (int16 full scale 32768) at or under which a window is digital silence: -60 dBFS.
SILENCE_PEAK = 32


def is_digital_silence(samples: np.ndarray) -> bool:
    """True when no sample of ``samples`` (int16 PCM, or float in [-1, 1]) rises above -60 dBFS:
    such a window holds no speech, and Whisper decodes it to hallucinated text ("You"), so it is
    answered as silence without running the model (what a voice-activity detector would decide)."""
    if samples.size == 0:
        return True
    peak = float(np.max(np.abs(samples)))
    return peak <= (SILENCE_PEAK if samples.dtype == np.int16 else SILENCE_PEAK / 32768.0)


def needs_fallback(r: WindowResult, d: Decoding) -> bool:
    """True when ``r`` fails Whisper's quality thresholds and is not silence."""
    if r.silent:
        return False
    if d.compression_ratio_threshold is not None and r.compression_ratio > d.compression_ratio_threshold:
        return True
    return d.log_prob_threshold is not None and r.avg_logprob < d.log_prob_threshold


def best_attempt(attempts: Sequence[WindowResult], d: Decoding) -> WindowResult:
    """The attempt to keep when every temperature failed (see the module doc)."""
    limit = d.compression_ratio_threshold
    fitting = [a for a in attempts if limit is None or a.compression_ratio <= limit]
    return max(fitting, key=lambda a: a.avg_logprob) if fitting else attempts[-1]


# MIN_SPEECH_S (worker.windows): sound (seconds above the quiet level) a window's rest must hold
# to be decoded after a seek. Counted here in whole 20 ms frames, so 13 frames (0.26 s) are needed.


def tail_holds_speech(samples: np.ndarray, seek_s: float, sample_rate: int = 16_000,
                      end_s: float | None = None) -> bool:
    """True when the rest of a window from ``seek_s`` (seconds from the window's start) holds at
    least ``MIN_SPEECH_S`` of sound above the window's quiet level (``windows.sound_s``): only
    then is it decoded as a new part (see the module doc). ``samples``: the window, mono, shape
    ``(n,)``, int16 PCM or float in [-1, 1]; ``end_s``: where the span ends (default: the
    window's end). A span that starts at or past its end (or the window's) holds nothing
    (False). Raises ValueError for a negative ``seek_s``."""
    if seek_s < 0:
        raise ValueError(f"seek_s must be >= 0 seconds from the window's start, got {seek_s}")
    start = min(round(seek_s * sample_rate), len(samples))
    stop = len(samples) if end_s is None else min(max(0, round(end_s * sample_rate)), len(samples))
    if stop <= start:
        return False
    return sound_s(samples[start:stop], samples, sample_rate) >= MIN_SPEECH_S


def resumed_rest_holds(window: np.ndarray, result: WindowResult, d: Decoding, sample_rate: int = 16_000,
                       sought: WindowResult | None = None) -> bool:
    """True when ``result``, a rest decoded over its window's kept encoder output
    (``WindowTask.resume``; times from the window's start), may be kept: it wrote text whose
    last word's end is known (``last_word_end_s``), it passes Whisper's quality thresholds
    (``needs_fallback``: its no-speech probability is the whole window's, so only the
    log-probability and compression tests can speak), and no speech (``MIN_SPEECH_S`` of sound)
    follows its last word in ``window`` (the whole window, mono, int16 PCM or float in
    [-1, 1]): up to its own seek point when it seeks on, else to the window's end. Otherwise the
    rest is decoded again from its own audio, as without resuming.

    The last word's end, not the segment's closing timestamp: a resumed decode may close its
    segment over speech it did not write. On bench/accuracy.py's 10-minute file (seed 32, beam
    1) one wrote "The quick brown fox jumps over the lazy dog." and closed it at 28.0 s, over
    "Hello world" (about 27.2-28.2 s); the alignment ends "dog" at 26.34 s (26.16 s when the
    whole window's text was aligned), and the 0.76 s of sound after it sends the rest to be
    decoded again. Over eleven files at beam 1, every resumed rest that lost words left
    0.74-2.44 s of sound after its last word, every other one none (measured with the window's
    whole text aligned over the whole window; how the backend aligns now, and why that keeps
    these decisions: ``FasterWhisperBackend._last_word_end``).

    Nor is one kept that writes nothing but the end of the last segment ``sought`` (the decode
    that sought) completed, its ``last_segment_text`` (letters and digits, case ignored, from the
    start of one of its words; the whole segment included): over the window's whole encoder
    output the model may write the window's text again, and the alignment then squeezes it into
    the rest. Found by adversarial testing: a sentence spoken at 20.0-22.9 s between ticks, in a
    window of 0-29.9 s, was written 0.0-24.0 s, and the rest from 24.0 s wrote it again (in
    brown noise: written 0.0-25.0 s, again from 25.0 s, its last word "ending" at 27.02 s of a
    27.05 s window, 2.05 s of rest: over the repeated rest's ``MAX_REPEAT_S``). And on
    bench/accuracy.py's 20-minute file at beam 1 (this machine's int8 kernels), after a segment
    "Hello World. 1-2-3-4-5-6-7-8-9-10." the rest wrote "1, 2, 3, 4, 5, 6, 7, 8, 9, 10." over 5
    s of "The quick brown fox jumps over the lazy dog" (WER 0.0073; with the rest decoded from
    its own audio 0.000), where the first version of this check wanted the whole segment. Decoded
    from its own audio, the rest cannot copy it; one that really repeats the segment's end costs
    that decode. A rest without letters or digits is not compared (a ``sought`` whose loops were
    removed has none either).

    Nor is one kept that says a phrase of two words or more twice in a row
    (``says_a_phrase_twice``): a loop too short for the compression test. On bench/accuracy.py's
    4-minute file of seed 5 at beam 1, a resumed rest over "The quick brown fox jumps over the
    lazy dog" wrote "The Quick Brown Fox, the Quick Brown Fox,", and the alignment spread the
    second "Fox" over the rest of the sentence, so no sound seemed to follow it; decoded from its
    own audio the rest reads the sentence right. Speech that truly says a phrase twice costs that
    decode, nothing more."""
    if not result.text.strip() or result.last_word_end_s is None or needs_fallback(result, d):
        return False
    if sought is not None and _squashed(result.text) and _ends_with_words(sought.last_segment_text,
                                                                           _squashed(result.text)):
        return False
    if says_a_phrase_twice(result.text):
        return False
    return not tail_holds_speech(window, max(0.0, result.last_word_end_s), sample_rate, result.unfinished_from_s)


@dataclass(frozen=True)
class Split:
    """Decode the window again as two halves (the loop split; see the module doc)."""


def loops(r: WindowResult, d: Decoding) -> bool:
    """True when one of the timestamped segments ``r`` keeps (before its seek point, if any) is
    over the compression threshold by itself (``WindowResult.looping_segment``)."""
    return d.compression_ratio_threshold is not None and r.looping_segment and not r.silent


def follow_up(attempts: Sequence[WindowResult], d: Decoding, can_split: bool = False,
              was_split: bool = False) -> Retry | Split | Accept:
    """What to do after the latest of ``attempts`` (every decode of this window so far, in
    temperature order); ``can_split``: the window may be split (long enough, not split too
    often); ``was_split``: the window is a part of a loop split. Raises ValueError for no attempts."""
    if not attempts:
        raise ValueError("follow_up needs at least one attempt")
    last = attempts[-1]
    if needs_fallback(last, d):
        higher = [t for t in d.temperatures if t > last.temperature]
        if higher:
            return Retry(higher[0])
        kept = best_attempt(attempts, d)
    else:
        kept = last
    if loops(kept, d):
        if can_split:
            return Split()
        if was_split:
            kept = without_loops(kept, d)
        elif kept.fast_loop_free_text is not None:
            kept = without_loops(kept, d, too_fast_only=True)
    return Accept(kept, kept.unfinished_from_s)


def without_loops(r: WindowResult, d: Decoding, too_fast_only: bool = False) -> WindowResult:
    """``r`` without its segments over the compression threshold by themselves (see the module
    doc), or only those of them written faster than anyone speaks (``too_fast_only``;
    ``whisper_text.too_fast``): its text is the other segments' (``loop_free_text`` /
    ``fast_loop_free_text``)."""
    limit = d.compression_ratio_threshold

    def drop(s: Segment) -> bool:
        loops = limit is not None and s.compression_ratio is not None and s.compression_ratio > limit
        return loops and (not too_fast_only or too_fast(s.text, s.start_s, s.end_s))

    text = r.fast_loop_free_text if too_fast_only else r.loop_free_text
    return replace(r, text=text or "", looping_segment=False, last_segment_text="", tokens=(),
                   fast_loop_free_text=None, segments=[s for s in r.segments if not drop(s)])


_NOT_ALNUM = re.compile(r"[\W_]+")


def _words(text: str) -> list[str]:
    """``text``'s words: runs of letters and digits, lowercased ("1-2, Fox." -> ["1", "2", "fox"])."""
    return [w for w in _NOT_ALNUM.split(text.lower()) if w]


def _squashed(text: str) -> str:
    """``text`` lowercased with everything but letters and digits removed ("7, 8, 9, 10." -> "78910")."""
    return _NOT_ALNUM.sub("", text.lower())


def says_a_phrase_twice(text: str, min_words: int = 2) -> bool:
    """True when ``text``'s words (runs of letters and digits, case ignored) hold a run of at
    least ``min_words`` words followed at once by the same run ("The Quick Brown Fox, the Quick
    Brown Fox," but not "no, no" at the default, nor "one two three")."""
    words = _words(text)
    n = len(words)
    return any(words[i: i + k] == words[i + k: i + 2 * k]
               for k in range(min_words, n // 2 + 1) for i in range(n - 2 * k + 1))


def _ends_with_words(text: str, tail: str) -> bool:
    """True when ``tail`` (squashed) ends ``text`` squashed and starts where one of ``text``'s
    words does (words: runs of letters and digits), so "78910" ends "1-2-3-4-5-6-7-8-9-10." but
    "at" does not end "the cat"."""
    words = _words(text)
    starts = {0, *itertools.accumulate(len(w) for w in words)}  # where each word starts, squashed
    joined = "".join(words)
    return joined.endswith(tail) and len(joined) - len(tail) in starts


#: Longest a repeated rest's text may run from the rest's start, seconds: the speech an early
#: closing timestamp leaves behind is the segment's last word or words. The repeats found ran
#: 1.0 s ("78910.", H200) and 1.8 s ("4-5-6-7-8-9-10.", CPU beam 1); new speech that matched
#: a segment's end ran 4.0 s (see the module doc).
MAX_REPEAT_S = 2.0


def repeats_tail(previous: WindowResult, rest: WindowResult, rest_start_s: float = 0.0) -> bool:
    """True when ``rest`` (the decode of a window's rest after a seek) writes nothing but the end
    of the last segment ``previous`` (the decode that sought) completed, its
    ``last_segment_text`` (see the module doc): its text, letters and digits only and case
    ignored, is non-empty and ends that segment's from the start of one of its words, and it
    ends (``text_end_s``) within ``MAX_REPEAT_S`` of the rest's start, ``rest_start_s`` seconds
    from where ``rest``'s times count (0 for a rest decoded from its own audio; the seek point
    for a resumed rest, whose times count from its window's start)."""
    tail = _squashed(rest.text)
    return (bool(tail) and rest.text_end_s is not None and rest.text_end_s - rest_start_s <= MAX_REPEAT_S
            and _ends_with_words(previous.last_segment_text, tail))


#: openai/whisper ``transcribe``'s ``prompt_reset_on_temperature``: a decode accepted above it
#: starts the previous-text prompt afresh.
PROMPT_RESET_ON_TEMPERATURE = 0.5
#: The decodes a request keeps for its previous-text prompt (which takes at most 223 tokens).
PREVIOUS_DECODES = 223


def conditioning_context(context: tuple[PreviousText, ...], accepted: WindowResult, last_temperature: float
                         ) -> tuple[PreviousText, ...]:
    """The request's context for its next decode when decoding conditions on previous text
    (``WindowTask.previous``): ``context`` and what ``accepted`` (the decode just accepted) kept,
    its tokens, or its text when they are not known. A decode without text adds nothing and
    resets nothing (a dropped repeated rest; silence, which ``transcribe`` skips before its reset
    rule). Otherwise empty when ``last_temperature``, the temperature of the window's last
    attempt, is over 0.5: openai/whisper ``transcribe``'s ``prompt_reset_on_temperature``, which
    faster-whisper also applies when every temperature failed and an earlier attempt is kept.
    Keeps the last ``PREVIOUS_DECODES`` pieces: the prompt takes at most 223 tokens, every piece
    at least one."""
    text = accepted.text.strip()
    if accepted.silent or not text:
        return context
    if last_temperature > PROMPT_RESET_ON_TEMPERATURE:
        return ()
    return (*context, PreviousText(tokens=accepted.tokens) if accepted.tokens else PreviousText(text=text)
            )[-PREVIOUS_DECODES:]
