"""Text fields of requests: checked to be real text when a request is parsed.

JSON lets a string hold a lone UTF-16 surrogate (``"\\ud800"``); Python decodes it into a str
that cannot be encoded as UTF-8, so a prompt like that would first fail inside the model's
tokenizer (a 500, after the encoder has run). Every API's parser passes its text fields
through :func:`require_text`, which refuses such strings with a 400 naming the field.
"""

from __future__ import annotations

from tideserve.errors import BadInputError


def require_text(value: str, field: str) -> str:
    """``value`` unchanged when it is encodable as UTF-8 (every character a Unicode scalar
    value). Raises BadInputError naming ``field`` and the position (0-based, in characters)
    of the first lone surrogate otherwise."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        raise BadInputError(
            f"'{field}' is not valid text: character {exc.start} is a lone UTF-16 surrogate "
            f"(U+{ord(bad):04X}); send UTF-8 text, and in JSON write characters outside the Basic "
            "Multilingual Plane as a surrogate pair (\\ud83d\\ude00) or as the character itself"
        ) from None
    return value


def language_code(value: str | None, field: str) -> str | None:
    """``value`` as a language code (ISO-639-1 such as ``en``; 2-8 letters and ``-``), None when
    absent or empty. Raises BadInputError naming ``field`` otherwise. Whether the model speaks
    it is checked where the model is known (the worker, a 400 naming its languages)."""
    if not value:
        return None
    if not (2 <= len(value) <= 8 and value.replace("-", "").isalpha() and value.isascii()):
        raise BadInputError(f"'{field}' must be a language code such as 'en' (ISO-639-1), got {value[:20]!r}")
    return value.lower()
