"""SageMaker-style API: ``POST /invocations`` and ``GET /ping``.

Request: ``{"audio_data": "<base64 audio file>", "whisper_prompt": ""}`` (``whisper_prompt``
optional, used as Whisper's initial prompt). Response:
``{"code": 0, "message": "Success", "transcribe_text": "..."}``.
"""

from __future__ import annotations

import base64
import binascii
import json

from tideserve.errors import BadInputError
from tideserve.protocol.schemas import InvocationRequest, validate
from tideserve.protocol.text import language_code, require_text
from tideserve.protocol.types import TranscriptionRequest, TranscriptionResult, identification_fields


RAW_AUDIO_TYPES = ("audio/", "application/octet-stream")
"""Content types taken as the audio file itself (SageMaker runtime clients send the file as
the body: ``invoke_endpoint(Body=f.read(), ContentType="audio/wav")``)."""


def parse_invocation(body: bytes, content_type: str | None = None) -> TranscriptionRequest:
    """Parse an /invocations body: the audio file itself when ``content_type`` is ``audio/*``
    or ``application/octet-stream``, otherwise JSON ``{"audio_data", "whisper_prompt"}`` (any
    other content type, as before, so ``curl -d`` works). Raises BadInputError naming the
    problem (also for a ``whisper_prompt`` that is not valid text, such as a lone surrogate)."""
    ctype = (content_type or "").split(";", 1)[0].strip().lower()
    if ctype.startswith(RAW_AUDIO_TYPES):
        if not body:
            raise BadInputError(f"empty request body; with Content-Type {ctype} the body is the audio file itself")
        return TranscriptionRequest(audio=body)
    if not body:
        raise BadInputError('empty request body; send JSON {"audio_data": "<base64 audio>"}')
    hint = ('; send JSON {"audio_data": "<base64 audio>"}, or the audio file itself with Content-Type audio/* '
            "(or application/octet-stream)")
    if ctype == "application/x-www-form-urlencoded":  # curl -d's default type
        hint += "; with curl: --data-binary @clip.wav -H 'Content-Type: audio/wav'"
    elif ctype == "multipart/form-data":  # curl -F, the OpenAI habit
        hint = ("; /invocations takes no multipart form: send the audio file itself with Content-Type audio/* "
                "(curl --data-binary @clip.wav -H 'Content-Type: audio/wav'), or post the form to "
                "/v1/audio/transcriptions (OpenAI's API) instead")
    data = loads_json(body, "request body", hint)
    if not isinstance(data, dict):
        raise BadInputError(f"request body must be a JSON object, got {type(data).__name__}")
    req = validate(InvocationRequest, data, "the request body")
    if req.whisper_prompt is not None:
        require_text(req.whisper_prompt, "whisper_prompt")
    return TranscriptionRequest(audio=decode_base64(req.audio_data, "audio_data"), prompt=req.whisper_prompt or None,
                                language=language_code(req.language, "language"), task=req.task or "transcribe")


def loads_json(body: bytes, what: str, hint: str = ""):
    """``json.loads`` whose every failure is a BadInputError naming ``what`` (also nesting too
    deep for the parser and numbers too long to convert); ``hint`` ends the message."""
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(f"{what} is not valid JSON ({exc}){hint}") from None
    except RecursionError:
        raise BadInputError(f"{what} nests JSON too deeply") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise BadInputError(f"{what} is not acceptable JSON ({exc})") from None


def decode_base64(text: str, field: str) -> bytes:
    """Strict base64 (standard or URL-safe alphabet, padding optional), also as a data URI
    (``data:audio/wav;base64,...``, what a browser's ``FileReader.readAsDataURL`` gives: the
    prefix is dropped; RFC 2397). Raises BadInputError."""
    s = "".join(text.split())
    if s[:5].lower() == "data:":
        head, comma, rest = s.partition(",")
        if not comma or not head.lower().endswith(";base64"):
            raise BadInputError(f"'{field}' is a data URI without ';base64,'; send the audio file base64-encoded")
        s = rest
    if "-" in s or "_" in s:
        s = s.replace("-", "+").replace("_", "/")
    s += "=" * (-len(s) % 4)
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadInputError(f"'{field}' is not valid base64 ({exc}); encode the audio file with base64") from None


def format_invocation(result: TranscriptionResult) -> dict:
    """The answer body; with a language-ID model, also ``detected_language``,
    ``detected_language_probability`` and ``language_mismatch``."""
    return {"code": 0, "message": "Success", "transcribe_text": result.text, **identification_fields(result)}


CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
"""The header boto3's ``invoke_endpoint(CustomAttributes=...)`` sends (SageMaker runtime API)."""
API_KEY_ATTRIBUTE = "tideserve-api-key"


def api_key_from_custom_attributes(value: str | None) -> str | None:
    """The API key in a SageMaker ``CustomAttributes`` value such as
    ``"tideserve-api-key=KEY"`` (items separated by ``;`` or ``,``, each ``name=value``), or
    None. boto3 signs its requests with SigV4 in ``Authorization``, which tideserve does not
    verify, so this attribute is how a SageMaker runtime client sends a tideserve API key."""
    if not value:
        return None
    for item in value.replace(",", ";").split(";"):
        name, sep, key = item.partition("=")
        if sep and name.strip() == API_KEY_ATTRIBUTE and key.strip():
            return key.strip()
    return None
