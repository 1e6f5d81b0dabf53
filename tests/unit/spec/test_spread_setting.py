"""``EndpointSpec.spread_min_audio_s``: the gateway's setting, except that a model conditioning on
previous text is never spread (a later part cannot have the text before it)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tideserve.spec.models import InferenceEndpoint

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "whisper-tiny-en.yaml"


def _spec(decoding: dict, gateway: dict):
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["model"]["decoding"].update(decoding)
    doc["spec"]["gateway"].update(gateway)
    return InferenceEndpoint.model_validate(doc).spec


def test_spread_follows_the_gateway_setting_unless_the_model_conditions_on_previous_text():
    assert _spec({}, {}).spread_min_audio_s == 120.0
    assert _spec({}, {"spread_min_audio_s": 30}).spread_min_audio_s == 30.0
    assert _spec({}, {"spread_min_audio_s": 0}).spread_min_audio_s == 0.0
    assert _spec({"condition_on_previous_text": True}, {"spread_min_audio_s": 30}).spread_min_audio_s == 0.0


def test_the_part_grace_defaults_to_30_s_and_a_grace_under_1_s_is_refused_naming_the_field():
    import pydantic
    import pytest

    assert _spec({}, {}).gateway.spread_part_grace_s == 30.0
    assert _spec({}, {"spread_part_grace_s": 8}).gateway.spread_part_grace_s == 8.0
    with pytest.raises(pydantic.ValidationError, match=r"spread_part_grace_s[\s\S]*greater than or equal to 1"):
        _spec({}, {"spread_part_grace_s": 0.5})
