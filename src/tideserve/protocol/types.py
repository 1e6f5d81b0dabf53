"""Request and result types that every API is translated to and from."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TranscriptionRequest:
    """One transcription request, whatever API it came through.

    ``audio`` is the encoded audio file (wav, flac, mp3, ogg, webm...), not samples.
    ``prompt`` is Whisper's initial prompt (previous-context text); ``language`` an ISO code
    or None to use the endpoint's setting; ``timestamps`` asks for segment timestamps.
    """

    audio: bytes
    prompt: str | None = None
    language: str | None = None
    timestamps: bool = False
    task: str = "transcribe"  # or "translate": into English
    words: bool = False  # word timestamps (timestamp_granularities[]=word)


@dataclass(frozen=True)
class Word:
    """One word and its times in seconds from the start of the audio (cross-attention
    alignment, as Whisper's word timestamps); ``probability`` is the model's for its tokens."""

    start_s: float
    end_s: float
    word: str
    probability: float = 0.0


@dataclass(frozen=True)
class Segment:
    """A stretch of speech, times in seconds from the start of the audio."""

    start_s: float
    end_s: float
    text: str
    tokens: tuple[int, ...] = ()
    avg_logprob: float | None = None
    no_speech_prob: float | None = None
    compression_ratio: float | None = None
    words: tuple[Word, ...] = ()
    #: Where the decode that wrote this segment started (seconds from the start of the audio;
    #: Whisper's ``seek``) and its temperature (above 0 after a fallback).
    window_start_s: float = 0.0
    temperature: float = 0.0


@dataclass(frozen=True)
class TranscriptionResult:
    """The text of a whole file; ``segments`` are filled when timestamps were asked for, or decoded
    for a file of several windows at the endpoint's default (``Decoding.without_timestamps``)."""

    text: str
    language: str
    duration_s: float
    segments: list[Segment] = field(default_factory=list)
    #: The probability of ``language`` when the model detected it (first window); None when given.
    language_probability: float | None = None
    #: What the language-ID model beside an English-only model heard (``model.language_id``), with
    #: its probability, and whether that is a language the model cannot transcribe (the text is
    #: then the English-only model's attempt); None / False when no identification ran.
    detected_language: str | None = None
    detected_language_probability: float | None = None
    language_mismatch: bool = False


#: Response header naming the language heard when it is one the model cannot transcribe
#: (``TranscriptionResult.language_mismatch``), on every API and response format.
LANGUAGE_MISMATCH_HEADER = "X-Tideserve-Language-Mismatch"


def identification_fields(result: TranscriptionResult) -> dict:
    """``detected_language``, ``detected_language_probability`` (4 decimals) and
    ``language_mismatch`` of ``result`` when a language-ID model ran; {} otherwise."""
    if result.detected_language is None:
        return {}
    p = result.detected_language_probability
    return {"detected_language": result.detected_language,
            "detected_language_probability": None if p is None else round(p, 4),
            "language_mismatch": result.language_mismatch}


def identification_headers(result: TranscriptionResult) -> dict[str, str]:
    """``{LANGUAGE_MISMATCH_HEADER: <language code>}`` for a mismatch, else {}."""
    return {LANGUAGE_MISMATCH_HEADER: result.detected_language or ""} if result.language_mismatch else {}
