"""OpenAI-style ``POST /v1/audio/transcriptions`` (multipart form).

Fields: ``file`` (required), ``model`` (required, must be the endpoint's model name),
``prompt``, ``language``, ``response_format`` (json, text, verbose_json, srt, vtt),
``temperature`` (only 0 is supported: decoding is deterministic).
Formats follow the OpenAI API reference (audio/createTranscription).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tideserve.errors import BadInputError, UnknownModelError
from tideserve.protocol import schemas
from tideserve.protocol.text import language_code, require_text
from tideserve.protocol.types import TranscriptionRequest, TranscriptionResult, identification_fields

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
_TIMESTAMP_FORMATS = {"verbose_json", "srt", "vtt"}


def model_object(served_model: str) -> dict:
    """The OpenAI ``Model`` object of the served model (``GET /v1/models[/{id}]``)."""
    return {"id": served_model, "object": "model", "created": 0, "owned_by": "tideserve"}


def models_response(served_model: str, model_id: str | None, aliases: Sequence[str] = ()) -> dict:
    """``GET /v1/models`` (``model_id`` None: the list, the model then its ``aliases``) or
    ``GET /v1/models/{model_id}`` (the model or an alias). Raises UnknownModelError (404) for a
    model this endpoint does not serve."""
    if model_id is None:
        return {"object": "list", "data": [model_object(m) for m in (served_model, *aliases)]}
    if model_id != served_model and model_id not in aliases:
        raise UnknownModelError.naming(model_id, served_model, aliases)
    return model_object(model_id)


GRANULARITIES = "timestamp_granularities[]"
"""The form field (repeated) that asks for ``word`` and/or ``segment`` timestamps."""


def parse_form(fields: dict[str, str], file_bytes: bytes | None, served_model: str,
               aliases: Sequence[str] = (), task: str = "transcribe",
               granularities: Sequence[str] = ()) -> tuple[TranscriptionRequest, str]:
    """(request, response_format) from the form. Raises BadInputError / UnknownModelError;
    every text field must be valid text (no lone surrogates, which a part's charset such as
    ``unicode_escape`` can produce)."""
    for key, value in fields.items():
        require_text(value, f"form field {key}")
    if file_bytes is None and "file" in fields:
        raise BadInputError("form field 'file' was sent as text; attach the audio as a file upload "
                            "(curl -F file=@clip.wav)")
    if file_bytes is None:
        raise BadInputError("missing form field 'file': attach the audio file (multipart/form-data)")
    if not fields.get("model"):
        raise BadInputError(f"missing form field 'model'; this endpoint serves '{served_model}'")
    # the granularities only when sent, so that another API's name for them is seen as standing for them
    sent = {GRANULARITIES: list(granularities)} if granularities else {}
    schemas.validate(schemas.TranscriptionForm, {**fields, "file": file_bytes, **sent}, "the form")  # structure
    model = fields["model"]
    if model != served_model and model not in aliases:
        raise UnknownModelError.naming(model, served_model, aliases)
    fmt = fields.get("response_format") or "json"
    if fmt not in RESPONSE_FORMATS:
        raise BadInputError(f"response_format '{fmt}' is not supported; use one of {', '.join(RESPONSE_FORMATS)}")
    temp = fields.get("temperature")
    if temp not in (None, ""):
        try:
            t = float(temp)
        except ValueError:
            raise BadInputError(f"temperature must be a number, got {temp!r}") from None
        if t != 0.0:
            raise BadInputError("only temperature 0 is supported (deterministic decoding)")
    language = language_code(fields.get("language"), "language")
    req = TranscriptionRequest(
        audio=file_bytes,
        prompt=fields.get("prompt") or None,
        language=language,
        timestamps=fmt in _TIMESTAMP_FORMATS,
        task=task,
        words="word" in granularities,
    )
    for g in granularities:
        if g not in ("word", "segment"):
            raise BadInputError(f"timestamp_granularities[] must be word or segment, got {g[:20]!r}")
    if granularities and fmt != "verbose_json":
        raise BadInputError("timestamp_granularities[] needs response_format verbose_json (they are returned there)")
    return req, fmt


def _clock(t: float, sep: str) -> str:
    ms = max(0, round(t * 1000))
    h, rem = divmod(ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def to_srt(result: TranscriptionResult) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, blank line between cues."""
    cues = []
    for i, seg in enumerate(result.segments, 1):
        cues.append(f"{i}\n{_clock(seg.start_s, ',')} --> {_clock(seg.end_s, ',')}\n{seg.text.strip()}\n")
    return "\n".join(cues)


def to_vtt(result: TranscriptionResult) -> str:
    """WebVTT: ``WEBVTT`` header, cues ``HH:MM:SS.mmm --> HH:MM:SS.mmm``."""
    cues = ["WEBVTT\n"]
    for seg in result.segments:
        cues.append(f"{_clock(seg.start_s, '.')} --> {_clock(seg.end_s, '.')}\n{seg.text.strip()}\n")
    return "\n".join(cues)


def format_response(result: TranscriptionResult, fmt: str, task: str = "transcribe") -> tuple[bytes, str]:
    """(body, content type) for ``response_format`` ``fmt`` (``task`` names it in verbose_json)."""
    if fmt == "json":
        return json.dumps({"text": result.text}).encode(), "application/json"
    if fmt == "text":
        return (result.text + "\n").encode(), "text/plain; charset=utf-8"
    if fmt == "srt":
        return to_srt(result).encode(), "text/plain; charset=utf-8"
    if fmt == "vtt":
        return to_vtt(result).encode(), "text/vtt; charset=utf-8"
    body = {
        "task": task,
        "language": result.language,
        **({"language_probability": round(result.language_probability, 4)}
           if result.language_probability is not None else {}),
        **identification_fields(result),
        "duration": round(result.duration_s, 3),
        "text": result.text,
        "segments": [
            {
                "id": i,
                "seek": round(s.window_start_s * 100),  # mel frames (10 ms), as openai/whisper's transcribe
                "start": round(s.start_s, 3),
                "end": round(s.end_s, 3),
                "text": s.text,
                "tokens": list(s.tokens),
                "temperature": s.temperature,
                "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio,
                "no_speech_prob": s.no_speech_prob,
            }
            for i, s in enumerate(result.segments)
        ],
    }
    words = [w for s in result.segments for w in s.words]
    if words:  # asked for with timestamp_granularities[]=word
        body["words"] = [{"word": w.word, "start": round(w.start_s, 3), "end": round(w.end_s, 3)} for w in words]
    return json.dumps(body).encode(), "application/json"


# --- streaming (server-sent events, as OpenAI's transcription streaming) ---------------------
# Events: {"type": "transcript.text.delta", "delta": "..."} as text is ready, then
# {"type": "transcript.text.done", "text": "<the whole text>"} (with detected_language,
# detected_language_probability and language_mismatch when a language-ID model ran); each as one
# SSE "data:" line.
STREAM_FORMATS = ("json", "text")


def wants_stream(fields: dict[str, str]) -> bool:
    """The form's ``stream`` field (``true``/``false``, as the openai client sends it; absent:
    false). Raises BadInputError for another value, or for ``stream=true`` with a
    ``response_format`` other than json or text (a stream carries text deltas only)."""
    raw = (fields.get("stream") or "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise BadInputError(f"stream must be true or false, got {fields.get('stream')!r}")
    stream = raw in ("true", "1")
    fmt = fields.get("response_format") or "json"
    if stream and fmt not in STREAM_FORMATS:
        raise BadInputError(f"stream=true sends text deltas; use response_format json or text, not {fmt!r}")
    return stream


def sse(event: dict) -> bytes:
    """One server-sent event carrying ``event`` as JSON."""
    return b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"


def delta_event(delta: str) -> bytes:
    return sse({"type": "transcript.text.delta", "delta": delta})


def done_event(result: TranscriptionResult) -> bytes:
    """The last event: the whole text, and the language fields when a language-ID model ran
    (``identification_fields``; a streamed answer's headers leave before the language is heard)."""
    return sse({"type": "transcript.text.done", "text": result.text, **identification_fields(result)})


def error_event(code: str, message: str) -> bytes:
    """An error after the stream started (the status line is already sent): the openai client
    raises ``APIError`` with ``message`` for an event holding ``error``."""
    return sse({"type": "error", "error": {"message": message, "type": "server_error", "code": code}})


class DeltaOrder:
    """Turns texts finishing in any order into deltas in audio order. ``add(index, texts,
    complete)``: the non-empty texts of window (or stretch) ``index`` so far, in order, each
    call's extending the last one's for that index (``complete`` False: more may follow; True:
    these are all; a call after the complete one, or one with fewer texts than an earlier call,
    changes nothing); returns the deltas that can be sent now: the texts not yet sent of the
    first index not complete, once every index before it is complete. Joined, the deltas are
    every index's texts joined by one space, i.e. the final text."""

    def __init__(self) -> None:
        self._texts: dict[int, list[str]] = {}  # index -> its texts so far, from the first not complete on
        self._complete: set[int] = set()
        self._next = 0  # the first index not yet complete and sent
        self._sent = 0  # how many of ``_texts[_next]`` were sent
        self._started = False

    def add(self, index: int, texts: list[str], complete: bool = True) -> list[str]:
        if index < self._next or index in self._complete:
            return []  # already complete: nothing may change it
        kept = [t for t in texts if t]
        if index not in self._texts or len(kept) > len(self._texts[index]):  # never shorter: what was sent stays
            self._texts[index] = kept
        if complete:
            self._complete.add(index)
        out = []
        while self._next in self._texts:
            new = self._texts[self._next][self._sent:]
            if new:
                out.append((" " if self._started else "") + " ".join(new))
                self._started = True
                self._sent += len(new)
            if self._next not in self._complete:
                break
            del self._texts[self._next]
            self._complete.discard(self._next)
            self._next, self._sent = self._next + 1, 0
        return out
