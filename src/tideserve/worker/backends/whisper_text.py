"""Whisper output rules shared by every Whisper backend: silence detection, the unfinished-tail
(seek) rule and segments from timestamp tokens. Pure Python on token ids; no model library.

Thresholds are Whisper's reference defaults (``no_speech_threshold`` 0.6, ``logprob_threshold``
-1.0; one timestamp token = 20 ms), as faster-whisper applies them (sources: docs/facts.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

from tideserve.protocol.types import Segment
from tideserve.worker.backends.base import PreviousText, WindowResult, WindowTask

TIME_PRECISION_S = 0.02  # one timestamp token = 20 ms (Whisper)
MAX_LENGTH = 448  # Whisper decoder context, tokens
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0
MIN_TAIL_S = 0.5  # an untranscribed tail shorter than this is not decoded again
SAMPLE_RATE = 16_000


def previous_tokens(prompt: str | None, previous: Sequence[PreviousText], encode: Callable[[str], list[int]]
                    ) -> list[int]:
    """The token ids after ``<|startofprev|>`` (the caller keeps the last ``MAX_LENGTH // 2 - 1``
    of them): the client's ``prompt`` (``encode(prompt)``; none when empty), then, when decoding
    conditions on previous text, the tokens each earlier decode kept, timestamp tokens included,
    as openai/whisper and faster-whisper ``transcribe`` feed them back; a piece without tokens is
    ``encode(text)``. ``encode`` takes stripped text and puts the leading space.

    Why the timestamps: prompted with the text alone, tiny.en (beam 5) wrote the 26.7 s second
    window of bench/accuracy.py's 1-minute file as one segment holding three of its eight
    sentences (29 of 54 words); with them it wrote all eight, each a segment
    (tests/unit/worker/test_conditioning.py; README "Accuracy", conditioning)."""
    out: list[int] = []
    for piece in (PreviousText(text=prompt or ""), *previous):
        if piece.tokens:
            out += piece.tokens
        elif piece.text.strip():
            out += encode(piece.text.strip())
    return out


def compression_ratio(text: str) -> float:
    b = text.encode()
    return len(b) / len(zlib.compress(b)) if b else 0.0


def is_silence(no_speech_prob: float, avg_logprob: float, no_speech_threshold: float | None = NO_SPEECH_THRESHOLD,
               logprob_threshold: float | None = LOGPROB_THRESHOLD) -> bool:
    """Whisper's no-speech rule: the no-speech probability is over its threshold while the
    decode is not confident (average log-probability under its threshold). A threshold of None
    switches the rule off (no window is silence)."""
    if no_speech_threshold is None:
        return False
    if no_speech_prob <= no_speech_threshold:
        return False
    return logprob_threshold is None or avg_logprob < logprob_threshold


def seek_point(tokens: Sequence[int], timestamp_begin: int) -> tuple[int, float] | None:
    """Where Whisper's long-form loop seeks after a window (openai/whisper ``transcribe``):
    when the output has a completed segment pair (``<|t|><|t|>``) and does not end with a lone
    timestamp after text, the window is unfinished from the first timestamp of its last pair.
    Returns ``(k, seconds)``: keep ``tokens[:k]`` (text after the last pair is decoded again
    from the seek), seek to ``seconds`` in the window; None when the window is done."""
    is_ts = [t >= timestamp_begin for t in tokens]
    if len(tokens) >= 2 and not is_ts[-2] and is_ts[-1]:
        return None  # "text <|t|>": the last segment was closed; the window is done
    pairs = [i for i in range(1, len(tokens)) if is_ts[i] and is_ts[i - 1]]
    if not pairs:
        return None  # no completed segment boundary: the whole window is one segment
    k = pairs[-1]
    return k, (tokens[k - 1] - timestamp_begin) * TIME_PRECISION_S


#: Consecutive segments with the same tokens that the repetition guard takes for a loop.
LOOP_REPEATS = 3


def loop_point(tokens: Sequence[int], timestamp_begin: int) -> tuple[int, float] | None:
    """The repetition guard: where a decoding loop starts. When ``LOOP_REPEATS`` consecutive
    timestamped segments hold the same text tokens, returns ``(k, seconds)``: keep ``tokens[:k]``
    (through the first of them) and seek to its end, so the audio after it is decoded again
    from there. Seeking re-reads the audio, so speech that really repeats is transcribed again
    by the next part; only a loop the audio does not hold is dropped. None: no loop."""
    segs: list[tuple[tuple[int, ...], int, float]] = []  # (text tokens, index after closing ts, end s)
    text: list[int] = []
    for i, t in enumerate(tokens):
        if t >= timestamp_begin:
            if text:
                segs.append((tuple(text), i + 1, (t - timestamp_begin) * TIME_PRECISION_S))
                text = []
        else:
            text.append(t)
    for j in range(len(segs) - LOOP_REPEATS + 1):
        if all(segs[j + n][0] == segs[j][0] for n in range(1, LOOP_REPEATS)):
            return segs[j][1], segs[j][2]
    return None


def window_result(task: WindowTask, tokens: Sequence[int], language: str, avg_logprob: float, no_speech_prob: float,
                  eot: int, timestamp_begin: int, decode: Callable[[list[int]], str],
                  no_speech_threshold: float | None = NO_SPEECH_THRESHOLD,
                  logprob_threshold: float | None = LOGPROB_THRESHOLD,
                  compression_ratio_threshold: float | None = None) -> WindowResult:
    """The result of one decoded window from its sampled ``tokens`` (end-of-text excluded).

    Silence (``is_silence``) gives empty text with ``silent`` set. With timestamp tokens,
    ``unfinished_from_s`` marks speech left after the window's last completed segment
    (``seek_point``), and the tokens after it are dropped, since the next part decodes them
    again; a seek that does not move past the window's start (a last pair at 0.0 s), or past
    ``task.resume.from_s`` for a resumed decode (whose ``tokens`` then begin with the timestamp
    token it was resumed at; a timestamp it writes before that point is read as that point), or
    leaves less than ``MIN_TAIL_S`` is no seek, so a window is never decoded twice from the same
    point. When the whole text's compression ratio is over ``compression_ratio_threshold`` and
    its segments loop (``loop_point``), the window keeps the first of the repeated segments and
    seeks to its end instead (the repetition guard; it applies to the attempt the fallback rule
    keeps). Segments (absolute times) are filled when the task asked for timestamps. The
    quality signals (average log-probability, no-speech probability, compression ratio of the
    whole decoded text) are carried for the fallback rule.
    """
    tokens = within_audio(list(tokens), timestamp_begin, task.duration_s)
    full_text = decode([t for t in tokens if t < eot]).strip()
    # The quality signals ride on every result.
    avg, nsp, cr, temp = float(avg_logprob), float(no_speech_prob), compression_ratio(full_text), task.temperature
    if is_silence(no_speech_prob, avg_logprob, no_speech_threshold, logprob_threshold):
        return WindowResult(text="", language=language, silent=True, avg_logprob=avg, no_speech_prob=nsp,
                            compression_ratio=cr, temperature=temp)
    duration = task.duration_s
    unfinished = None
    seek = seek_point(tokens, timestamp_begin)
    guarded = None  # the repetition guard's seek, when it took one
    if compression_ratio_threshold is not None and cr > compression_ratio_threshold:
        guarded = loop_point(tokens, timestamp_begin)
        seek = guarded or seek
    floor = task.resume.from_s if task.resume is not None else 0.0  # a resumed decode starts there
    if task.resume is not None:  # no time before it (CTranslate2 does not order sampled after forced timestamps)
        lowest = timestamp_begin + round(floor / TIME_PRECISION_S)
        tokens = [max(t, lowest) if t >= timestamp_begin else t for t in tokens]
    if seek is not None:
        k, at = seek
        if at > floor and duration - at > MIN_TAIL_S:
            unfinished = at
            tokens = tokens[:k]
    text = full_text if unfinished is None else decode([t for t in tokens if t < eot]).strip()
    segments = []
    looping = False
    fast = False  # a segment loops by itself faster than anyone speaks
    loop_free: list[str] = []  # the texts of the segments that do not loop by themselves
    fast_free: list[str] = []  # ... that do not loop faster than anyone speaks
    timestamped = any(t >= timestamp_begin for t in tokens)
    spans = split_by_timestamps(tokens, timestamp_begin, duration)
    if task.timestamps or (timestamped and compression_ratio_threshold is not None and cr > compression_ratio_threshold):
        for start, end, seg_tokens in spans:
            seg_text = decode(seg_tokens).strip()
            seg_cr = compression_ratio(seg_text)
            seg_loops = timestamped and compression_ratio_threshold is not None and seg_cr > compression_ratio_threshold
            looping |= seg_loops
            seg_fast = seg_loops and too_fast(seg_text, start, end)
            fast |= seg_fast
            if seg_text and not seg_loops:
                loop_free.append(seg_text)
            if seg_text and not seg_fast:
                fast_free.append(seg_text)
            if seg_text and task.timestamps:
                segments.append(Segment(
                    start_s=task.offset_s + start, end_s=task.offset_s + end, text=seg_text,
                    tokens=tuple(seg_tokens), avg_logprob=float(avg_logprob),
                    no_speech_prob=float(no_speech_prob), compression_ratio=seg_cr,
                    window_start_s=task.offset_s, temperature=task.temperature,
                ))
    last = ""
    # The segment an early closing timestamp cut short (longform.repeats_tail). Not after the
    # repetition guard's seek: the next part transcribes speech that really repeats (loop_point).
    if unfinished is not None and guarded is None:
        texts = [s.text for s in segments] or [decode(t).strip() for _, _, t in spans]
        last = next((t for t in reversed(texts) if t), "")
    return WindowResult(text=text, language=language, segments=segments, unfinished_from_s=unfinished,
                        last_segment_text=last, text_end_s=spans[-1][1] if spans else None,
                        tokens=_fed_back(tokens, eot, timestamp_begin, duration),
                        avg_logprob=avg, no_speech_prob=nsp, compression_ratio=cr, temperature=temp,
                        looping_segment=looping, loop_free_text=" ".join(loop_free) if looping else None,
                        fast_loop_free_text=" ".join(fast_free) if fast else None)


def _fed_back(tokens: Sequence[int], eot: int, timestamp_begin: int, duration_s: float) -> tuple[int, ...]:
    """``WindowResult.tokens``: the completed segments of ``tokens`` as ``transcribe`` feeds them
    back (faster-whisper slices a decode at consecutive timestamp tokens): end-of-text dropped,
    and a last timestamp that only opens a next segment too. Times past the window's audio (in its
    padding) are read as its end, and a timestamped decode's text left open there is closed by
    it: the segments' own times (``split_by_timestamps``; ``transcribe`` would seek to the last
    timestamp instead, into a 30 s window of audio). Each of these loose ends in the prompt made
    tiny.en go on with the prompt's pattern: a count that is not in the audio opened the 1-minute
    file's second window after a rest that wrote "<|26.20|> Hello World.<|29.20|><|29.20|>" in a
    27.75 s window (tests/unit/worker/test_conditioning.py)."""
    end = timestamp_begin + round(min(duration_s, 30.0) / TIME_PRECISION_S)
    out = [min(t, end) if t >= timestamp_begin else t for t in tokens if t != eot]
    if len(out) >= 2 and out[-1] >= timestamp_begin and out[-2] >= timestamp_begin:
        out.pop()
    elif out and out[-1] < timestamp_begin and any(t >= timestamp_begin for t in out):
        out.append(end)
    return tuple(out)


#: Characters per second of its audio over which a segment that loops by itself is taken for
#: one the audio does not hold (``too_fast``; ``longform.follow_up``). Twice a fast speaking
#: rate: 200 words a minute of about 6 characters each (a space included) is 20 a second. Found:
#: 60 s of room noise at -40 dBFS came back with "I'm going to do a little bit of a little bit of
#: ..." (about 700 characters) over its last 8 s window (87 a second).
MAX_LOOP_CHARS_PER_S = 40.0


def too_fast(text: str, start_s: float, end_s: float) -> bool:
    """True when ``text`` written over ``start_s``-``end_s`` (seconds) is more than
    ``MAX_LOOP_CHARS_PER_S`` characters per second (a zero-length span counts as 20 ms)."""
    return len(text) / max(end_s - start_s, TIME_PRECISION_S) > MAX_LOOP_CHARS_PER_S


def within_audio(tokens: list[int], timestamp_begin: int, duration_s: float) -> list[int]:
    """``tokens`` up to the first timestamp that opens a segment at or past ``duration_s`` (the
    window's audio; the rest of its 30 s input is zeros): what follows was written over no
    audio. A timestamp there that closes a segment begun inside the audio stays (read as the
    audio's end by ``split_by_timestamps``). Found: room noise at -40 dBFS came back with eight
    ". ." segments from 15.47 s on, each ending at 12.97 s, where its window's audio ended."""
    written = False  # text since the last timestamp
    for i, t in enumerate(tokens):
        if t < timestamp_begin:
            written = True
        elif not written and (t - timestamp_begin) * TIME_PRECISION_S >= duration_s:
            return tokens[:i]
        else:
            written = False
    return tokens


def split_by_timestamps(
    tokens: Sequence[int], timestamp_begin: int, duration_s: float
) -> list[tuple[float, float, list[int]]]:
    """Segments ``(start_s, end_s, text tokens)`` from Whisper's ``<|t0|> text <|t1|>`` output.

    A segment is closed by the first timestamp after some text; text left open at the end
    runs to ``duration_s``. Times are relative to the window.
    """
    segments: list[tuple[float, float, list[int]]] = []
    start: float | None = None
    text: list[int] = []
    for t in tokens:
        if t >= timestamp_begin:
            ts = (t - timestamp_begin) * TIME_PRECISION_S
            if text:
                segments.append((start if start is not None else 0.0, min(ts, duration_s), text))
                text, start = [], None
            else:
                start = ts
        else:
            text.append(t)
    if text:
        segments.append((start if start is not None else 0.0, duration_s, text))
    return segments
