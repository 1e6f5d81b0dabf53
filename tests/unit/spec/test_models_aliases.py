"""Model aliases: other names for the served model on every API (issue 16)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tideserve.spec.models import ModelSpec


def test_aliases_are_served_names_and_must_be_distinct():
    m = ModelSpec(name="whisper-tiny.en", source="pkg://p/m", aliases=["whisper-1"])
    assert m.serves("whisper-1") and m.serves("whisper-tiny.en") and not m.serves("whisper-2")
    for aliases in (["whisper-tiny.en"], ["a", "a"]):
        with pytest.raises(ValidationError, match="repeats the model's name or another alias"):
            ModelSpec(name="whisper-tiny.en", source="pkg://p/m", aliases=aliases)
    with pytest.raises(ValidationError, match="should match pattern"):
        ModelSpec(name="m", source="pkg://p/m", aliases=["has space"])
