"""Whisper output rules shared by every Whisper backend: silence detection, the unfinished-tail
(seek) rule and segments from timestamp tokens. Pure Python on token ids; no model library.

Thresholds are Whisper's reference defaults (``no_speech_threshold`` 0.6, ``logprob_threshold``
-1.0; one timestamp token = 20 ms), as faster-whisper applies them.
"""

from __future__ import annotations

import zlib
from typing import Callable, Sequence

from tideserve.protocol.types import Segment
from tideserve.worker.backends.base import WindowResult, WindowTask

TIME_PRECISION_S = 0.02  # one timestamp token = 20 ms (Whisper)
MAX_LENGTH = 448  # Whisper decoder context, tokens
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0
MIN_TAIL_S = 0.5  # an untranscribed tail shorter than this is not decoded again
SAMPLE_RATE = 16_000


def compression_ratio(text: str) -> float:
    b = text.encode()
    return len(b) / len(zlib.compress(b)) if b else 0.0


def window_result(task: WindowTask, tokens: Sequence[int], language: str, avg_logprob: float, no_speech_prob: float,
                  eot: int, timestamp_begin: int, decode: Callable[[list[int]], str]) -> WindowResult:
    """The result of one decoded window from its sampled ``tokens`` (end-of-text excluded).

    A window whose no-speech probability exceeds 0.6 while its average log-probability is
    below -1.0 is silence (empty text). With timestamp tokens, ``unfinished_from_s`` marks
    speech the model left after its last timestamp (Whisper's long-form seek rule); segments
    (absolute times) are filled when the task asked for timestamps.
    """
    tokens = list(tokens)
    text = decode([t for t in tokens if t < eot]).strip()
    if no_speech_prob > NO_SPEECH_THRESHOLD and avg_logprob < LOGPROB_THRESHOLD:
        return WindowResult(text="", language=language)
    duration = len(task.samples) / SAMPLE_RATE
    unfinished = None
    stamps = [t for t in tokens if t >= timestamp_begin]
    if stamps:
        # Output ending in "text <|t|>" closed its last segment and the window is done;
        # otherwise (ending in "<|t|><|t|>" or in text) the model left the speech after its
        # last timestamp for the next window.
        single_ending = len(tokens) >= 2 and tokens[-2] < timestamp_begin <= tokens[-1]
        last = (stamps[-1] - timestamp_begin) * TIME_PRECISION_S
        if not single_ending and duration - last > MIN_TAIL_S:
            unfinished = last
    segments = []
    if task.timestamps:
        for start, end, seg_tokens in split_by_timestamps(tokens, timestamp_begin, duration):
            seg_text = decode(seg_tokens).strip()
            if seg_text:
                segments.append(Segment(
                    start_s=task.offset_s + start, end_s=task.offset_s + end, text=seg_text,
                    tokens=tuple(seg_tokens), avg_logprob=float(avg_logprob),
                    no_speech_prob=float(no_speech_prob), compression_ratio=compression_ratio(seg_text),
                ))
    return WindowResult(text=text, language=language, segments=segments, unfinished_from_s=unfinished)


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
