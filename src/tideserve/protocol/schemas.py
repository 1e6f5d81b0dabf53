"""The shapes of the APIs' JSON and form bodies, as pydantic models: the parsers validate
requests with them (``validate``) and ``protocol.openapi`` publishes their JSON Schemas, so the
document served at ``/openapi.json`` and what the servers accept come from one definition.

Only structure lives here (fields, types, enumerations); what a schema cannot say (that a
base64 string decodes to audio, that text has no lone surrogate, tensor names and counts) is
checked by the parsers after validation.
"""

from __future__ import annotations

import itertools
import typing
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tideserve.errors import BadInputError

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")


class _Body(BaseModel):
    # Unknown keys are ignored, as the parsers always did (clients send their own), unless one
    # stands for a field the body lacks (``unknown_key_error``); no coercion between JSON types.
    model_config = ConfigDict(extra="allow", strict=True)
    #: Keys that are another API's name for one of these fields: key -> the field's name here (compared
    #: in any case, with or without ``_`` and ``-`` between words).
    MISNAMED: ClassVar[dict[str, str]] = {}


# --- SageMaker style -------------------------------------------------------------------------
class InvocationRequest(_Body):
    """``POST /invocations`` (and ``/endpoints/{endpoint}/invocations``) as JSON."""

    MISNAMED: ClassVar[dict[str, str]] = {"prompt": "whisper_prompt", "initial_prompt": "whisper_prompt", "lang": "language"}
    audio_data: str = Field(min_length=1, description="the base64-encoded audio file (WAV, FLAC, MP3, OGG, ...)")
    whisper_prompt: str | None = Field(None, description="Whisper's initial prompt (text)")
    language: str | None = Field(None, description="the spoken language, e.g. en (ISO-639-1); default: the model's")
    task: Literal["transcribe", "translate"] | None = Field(
        None, description="translate: into English (multilingual models); default transcribe")


class InvocationResponse(_Body):
    code: Literal[0] = 0
    message: str = "Success"
    transcribe_text: str
    detected_language: str | None = Field(None, description="with a language-ID model (model.language_id): "
                                          "the language heard")
    detected_language_probability: float | None = None
    language_mismatch: bool | None = Field(None, description="true: speech in a language the model cannot "
                                           "transcribe (the text is its attempt)")


# --- KServe v2 -------------------------------------------------------------------------------
class InferInputTensor(_Body):
    name: str = Field(description="AUDIO (the encoded audio file) or PROMPT (text)")
    datatype: str = Field(description="BYTES")
    shape: list[int] = Field(description="[1]")
    parameters: dict[str, Any] | None = Field(None, description="binary_data_size with the binary tensor extension")
    data: list[Any] | None = Field(None, description="the elements in JSON form; for AUDIO a base64 string")


class InferRequestedOutput(_Body):
    name: str = Field(description="TEXT")
    parameters: dict[str, Any] | None = Field(None, description="binary_data: true for a binary answer")


class InferRequest(_Body):
    """``POST /v2/models/{name}/infer`` (the JSON header, when the binary extension is used)."""

    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[InferInputTensor]
    outputs: list[InferRequestedOutput] | None = None


class InferOutputTensor(_Body):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | None = None
    parameters: dict[str, Any] | None = None


class InferResponse(_Body):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[InferOutputTensor]


class RepositoryIndexRequest(_Body):
    ready: bool = Field(False, description="list only models that are ready")


# --- OpenAI style ----------------------------------------------------------------------------
class TranscriptionForm(_Body):
    """``POST /v1/audio/transcriptions`` (multipart/form-data): every field but ``file`` is text."""

    model_config = ConfigDict(extra="allow", strict=False)
    MISNAMED: ClassVar[dict[str, str]] = {"whisper_prompt": "prompt", "initial_prompt": "prompt", "lang": "language",
                                          "timestamp_granularities": "timestamp_granularities[]",
                                          "timestamp_granularity": "timestamp_granularities[]"}
    file: bytes = Field(description="the audio file", json_schema_extra={"format": "binary"})
    model: str = Field(min_length=1, description="the served model's name")
    prompt: str | None = None
    language: str | None = Field(None, description="ISO-639-1 code, e.g. en")
    response_format: Literal["json", "text", "verbose_json", "srt", "vtt"] = "json"
    temperature: float | None = Field(None, description="only 0 (deterministic decoding)")
    timestamp_granularities: list[Literal["word", "segment"]] | None = Field(
        None, alias="timestamp_granularities[]", description="word: words with times (verbose_json)")
    stream: str | None = Field(None, pattern=r"^(?i:true|false|1|0)$",
                               description="true: server-sent events (transcript.text.delta, then .done)")


class TranscriptionJson(_Body):
    text: str


class ErrorBody(_Body):
    """Every error answer (README, "Errors"). ``code``: the stable error code, or on the
    SageMaker style routes the HTTP status (an integer, as their success answer's 0)."""

    model_config = ConfigDict(extra="allow", strict=False)
    code: str | int
    message: str
    request_id: str | None = None
    error: str | dict[str, Any] | None = None


#: How many unknown keys of one body are compared with the fields: a misspelling sits among a
#: request's few keys, and comparing them all would let a body of a million keys cost seconds of
#: CPU (difflib over every key: 8.4 s, against 0.7 s to parse the body, 2026-12-07).
MAX_KEYS_COMPARED = 32
#: Fields shorter than this are not matched (``id``, ``task``, ``file``: a client's ``uid`` or
#: ``tsk`` is as likely its own key as a slip).
MIN_FIELD_CHARS = 5


def typo_distance(a: str, b: str) -> int:
    """Edits between ``a`` and ``b``, case ignored: insertions, deletions, substitutions and
    swaps of two neighbours (the optimal string alignment distance, Damerau 1964), so
    ``langauge`` is 1 from ``language`` and ``prompt_id`` 3 from ``prompt``. O(len(a) * len(b)):
    the callers pass field names and keys of at most 64 characters. (The standard library's
    difflib has no edit distance; a dependency for these few lines is not worth it.)"""
    a, b = a.lower(), b.lower()
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


def _joined(key: str) -> str:
    """``key`` in lower case without ``_`` and ``-``: the form ``MISNAMED``'s keys are compared in."""
    return key.lower().replace("_", "").replace("-", "")


def unknown_key_error(model: type[BaseModel], data: Any, what: str) -> str | None:
    """The message for the first key of ``data`` that is not a field of ``model`` but stands for
    one the body lacks, else None: another API's name for it (``model.MISNAMED``), or a slip of
    the keyboard (``typo_distance`` at most 1, or 2 for a field of more than 8 characters; fields
    of ``MIN_FIELD_CHARS`` or more). Such a key would otherwise be ignored silently and the
    request served without what it asked for (a misspelt ``language`` transcribed in the model's
    default). A key beside the field it resembles (``languages`` with ``language``) is the
    client's own, as is every other unknown key. Only the first ``MAX_KEYS_COMPARED`` unknown
    keys are looked at."""
    if not isinstance(data, dict):
        return None
    names = [f.alias or n for n, f in model.model_fields.items()]
    absent = [n for n in names if n not in data and len(n) >= MIN_FIELD_CHARS]
    # another API's names, in any case or word joining (initial_prompt, initialPrompt, initial-prompt)
    misnamed = {_joined(k): v for k, v in getattr(model, "MISNAMED", {}).items()}
    unknown = (key for key in data if isinstance(key, str) and key not in names)
    for key in itertools.islice(unknown, MAX_KEYS_COMPARED):
        if (meant := misnamed.get(_joined(key))) in absent:
            return f"unknown field '{key}' in {what}: this API calls it '{meant}'"
        if len(key) > 64:
            continue
        for name in absent:
            if abs(len(key) - len(name)) <= 2 and typo_distance(key, name) <= (1 if len(name) <= 8 else 2):
                return f"unknown field '{key}' in {what}: did you mean '{name}'?"
    return None


#: The most elements of a list of bodies (KServe's ``inputs`` and ``outputs``) whose keys are compared.
MAX_ITEMS_COMPARED = 16


def _body_type(annotation: Any) -> type[BaseModel] | None:
    """The body model inside a field's annotation (``X``, ``list[X]``, ``list[X] | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((t for t in map(_body_type, typing.get_args(annotation)) if t is not None), None)


def nested_key_error(model: type[BaseModel], data: Any, what: str) -> str | None:
    """``unknown_key_error`` for ``data`` and, in turn, for the bodies nested in it (a KServe
    request's input and output tensors: ``"paramters"`` for ``parameters`` would otherwise drop
    ``binary_data_size`` silently), each named by its place (``inputs.0``); at most
    ``MAX_ITEMS_COMPARED`` elements of a list."""
    if (msg := unknown_key_error(model, data, what)) is not None or not isinstance(data, dict):
        return msg
    for name, field in model.model_fields.items():
        sub, value = _body_type(field.annotation), data.get(field.alias or name)
        if sub is None or value is None:
            continue
        items = value[:MAX_ITEMS_COMPARED] if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            place = f"{name}.{i}" if isinstance(value, list) else name  # as validate names places
            if (msg := nested_key_error(sub, item, f"{what} ({place})")) is not None:
                return msg
    return None


def validate(model: type[BaseModel], data: Any, what: str) -> Any:
    """``data`` (parsed JSON, or form fields) validated as ``model``; returns the model
    instance. Raises BadInputError naming the first wrong field of ``what`` and what it
    must be (its description when it has one), or a key that misspells or misnames a field
    (``nested_key_error``: the body's own keys and its nested bodies'); other unknown keys are ignored."""
    if (msg := nested_key_error(model, data, what)) is not None:
        raise BadInputError(msg)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        if err["type"] == "string_unicode":  # a lone surrogate in a value, or in a key (then loc is the key's object)
            place = f"'{where}' in {what}" if where else f"a key of {what}"
            raise BadInputError(f"{place} holds text that is not valid ({str(err.get('input'))[:40]!r}: a lone "
                                "surrogate, or bytes that are not UTF-8); send keys and values as UTF-8 text") from None
        field = model.model_fields.get(str(err["loc"][0])) if err["loc"] else None
        if err["type"] == "missing":
            hint = f": {field.description}" if field is not None and field.description else ""
            raise BadInputError(f"missing field '{where}' in {what}{hint}") from None
        if err["type"] == "string_too_short" and err.get("input") == "":
            raise BadInputError(f"'{where}' in {what} is empty{': ' + field.description if field and field.description else ''}") from None
        got = type(err.get("input")).__name__
        msg = err["msg"][:1].lower() + err["msg"][1:]
        raise BadInputError(f"'{where}' in {what} is wrong: {msg} (got {got} {str(err.get('input'))[:40]!r})") from None
