"""What the gateway (or the local runtime) and its workers, and workers among themselves, send
each other; never sent by clients: headers, and the part protocol of a spread file (its options
as a header, its result as JSON, and how the parts' results join into one).

Defined once here so the gateway, the runtime and the worker agree.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tideserve.errors import BadInputError
from tideserve.protocol.text import language_code, require_text
from tideserve.protocol.types import Segment, TranscriptionRequest, TranscriptionResult, Word

#: The shared secret a worker requires on every route but liveness (the gateway, the runtime's
#: readiness checks and the Kubernetes readiness probe send it). A worker also takes it as
#: ``Authorization: Bearer TOKEN``, which is what Prometheus's scrape ``authorization`` sends.
TOKEN_HEADER = "X-Tideserve-Token"

#: Set by workers on each answer: model compute time the request used, in milliseconds (text).
COMPUTE_HEADER = "X-Tideserve-Compute-Ms"

#: Worker -> gateway, on a 503 for ``ReplicaNotReadyError`` (loading, draining, its engine gone):
#: "1". The gateway routes around that replica until a health check passes.
NOT_READY_HEADER = "X-Tideserve-Not-Ready"

#: Gateway -> worker, on a request whose audio may be long: the base URLs of replicas the gateway
#: reserved for it because they were idle (comma-separated); the worker may send parts of the
#: file there (``PART_PATH``). Set only by the gateway, which authenticates with ``TOKEN_HEADER``.
SPREAD_HEADER = "X-Tideserve-Spread"

#: Worker -> worker: a part of a spread file, as multipart/form-data with the request's options
#: as JSON in the field ``PART_OPTIONS`` (``part_options``; a field, not a header: a prompt of
#: 2,000 characters outside ASCII is over 8 KB escaped, past aiohttp's header limit) and the
#: part's audio, a 16 kHz mono 16-bit WAV file, in the field ``PART_AUDIO``; answered with
#: ``result_to_json``.
PART_PATH = "/internal/part"
PART_OPTIONS = "options"
PART_AUDIO = "audio"

#: Worker -> client (through the gateway): how many parts the file was transcribed in (1: not spread).
PARTS_HEADER = "X-Tideserve-Parts"


def part_options(prompt: str | None, language: str | None, timestamps: bool, task: str, words: bool,
                 cuts: tuple[tuple[int, int], ...] = ()) -> str:
    """The ``PART_OPTIONS`` field: a part's options as compact JSON; ``cuts``: the part's windows
    as ``(start, end)`` sample indices from its start (empty: the helper cuts the part itself)."""
    doc: dict[str, Any] = {"prompt": prompt, "language": language, "timestamps": timestamps, "task": task,
                           "words": words}
    if cuts:
        doc["cuts"] = [list(c) for c in cuts]
    return json.dumps(doc, separators=(",", ":"))


def _cuts(value: Any) -> tuple[tuple[int, int], ...]:
    """``cuts`` of ``part_options`` checked: pairs of whole sample indices, each non-empty, in
    order, without overlap. Raises BadInputError naming what is wrong."""
    if not isinstance(value, list) or not value or not all(
            isinstance(c, list) and len(c) == 2 and all(type(x) is int for x in c) for c in value):
        raise BadInputError(f"the '{PART_OPTIONS}' field: 'cuts' must be a non-empty list of [start, end] "
                            "sample indices")
    end = 0
    for a, b in value:
        if not end <= a < b:
            raise BadInputError(f"the '{PART_OPTIONS}' field: 'cuts' must be non-empty windows in order without "
                                f"overlap, from sample 0; [{a}, {b}] is not")
        end = b
    return tuple((a, b) for a, b in value)


def parse_part_options(value: str) -> dict[str, Any]:
    """The options of ``part_options``, checked as every API checks its own (text, language
    code, task). Raises BadInputError naming what is wrong."""
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):
        raise BadInputError(f"the '{PART_OPTIONS}' field must be JSON") from None
    if not isinstance(doc, dict) or set(doc) - {"cuts"} != {"prompt", "language", "timestamps", "task", "words"}:
        raise BadInputError(f"the '{PART_OPTIONS}' field must be a JSON object with prompt, language, timestamps, "
                            "task and words (and optionally cuts)")
    for key, kinds in (("prompt", (str, type(None))), ("language", (str, type(None))), ("timestamps", (bool,)),
                       ("task", (str,)), ("words", (bool,))):
        if not isinstance(doc[key], kinds):
            raise BadInputError(f"the '{PART_OPTIONS}' field: '{key}' has the wrong type")
    if doc["prompt"] is not None:
        require_text(doc["prompt"], "prompt")
    doc["language"] = language_code(doc["language"], "language")
    if doc["task"] not in ("transcribe", "translate"):
        raise BadInputError(f"the '{PART_OPTIONS}' field: task must be transcribe or translate")
    doc["cuts"] = _cuts(doc["cuts"]) if "cuts" in doc else None
    return doc


def part_request(audio: bytes, options: str) -> tuple[TranscriptionRequest, tuple[tuple[int, int], ...] | None]:
    """A part's request from its ``PART_AUDIO`` bytes and ``PART_OPTIONS`` field, and its windows
    (None: not given). Raises BadInputError as ``parse_part_options``."""
    doc = parse_part_options(options)
    cuts = doc.pop("cuts")
    return TranscriptionRequest(audio=audio, **doc), cuts


def result_to_json(result: TranscriptionResult) -> dict[str, Any]:
    """Every field of ``result`` as JSON (times in seconds), for ``result_from_json``."""
    return dataclasses.asdict(result)


def result_from_json(doc: dict[str, Any]) -> TranscriptionResult:
    """The inverse of ``result_to_json``. Raises ValueError / KeyError / TypeError on another shape."""
    segments = [Segment(**{**s, "tokens": tuple(s["tokens"]), "words": tuple(Word(**w) for w in s["words"])})
                for s in doc["segments"]]
    return TranscriptionResult(**{**doc, "segments": segments})


def shifted(result: TranscriptionResult, offset_s: float) -> list[Segment]:
    """``result``'s segments (and their words) moved ``offset_s`` seconds later."""
    return [dataclasses.replace(
        s, start_s=s.start_s + offset_s, end_s=s.end_s + offset_s, window_start_s=s.window_start_s + offset_s,
        words=tuple(dataclasses.replace(w, start_s=w.start_s + offset_s, end_s=w.end_s + offset_s) for w in s.words))
        for s in result.segments]


def joined(first: TranscriptionResult, parts: list[tuple[float, TranscriptionResult]],
           duration_s: float) -> TranscriptionResult:
    """One file's result from its first part's and the later parts' ``(offset_s, result)`` (times
    relative to each part's start), in audio order: texts joined by one space, segments moved to
    the file's time; the language is the first part's, the identification (language-ID model)
    the first in audio order that has one (a file that opens with silence is identified in a
    later part, as in one piece)."""
    later = sorted(parts, key=lambda p: p[0])
    texts = [t for t in (first.text, *(r.text for _, r in later)) if t]
    segments = list(first.segments) + [s for off, r in later for s in shifted(r, off)]
    heard = next((r for r in (first, *(r for _, r in later)) if r.detected_language is not None), first)
    return dataclasses.replace(first, text=" ".join(texts), segments=segments, duration_s=duration_s,
                               detected_language=heard.detected_language,
                               detected_language_probability=heard.detected_language_probability,
                               language_mismatch=heard.language_mismatch)
