"""The multilingual example (examples/whisper-base.yaml: Whisper base from two PyPI packages,
joined by the pkg:// parts source) through the gateway (issue 16): each language's speech
clips come back in their language and script, the language detected in verbose_json; a
language the model cannot do is a 400 naming the ones it can."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import httpx
import jiwer
import pytest
import yaml

from endpoint import ROOT, EndpointProcess

MODEL = "whisper-base"
# Measured CER of each speech clip (bench/results/multilingual_base.json) is <= 0.57; the bound
# leaves room for run-to-run variation of int8 decoding, not for another language or script.
MAX_CER = 0.65
LANGUAGES = ("en", "es", "fr", "it", "pt", "ja", "zh")  # pl and hi: base is too weak (see README)
COUNTING = {"counting", "conteo", "comptage", "conteggio", "kazoeru", "contagem", "jishu"}  # answered as digits
CJK = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", "", unicodedata.normalize("NFKC", s).lower()).split())


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("base")
    doc = yaml.safe_load((ROOT / "examples" / "whisper-base.yaml").read_text())
    doc["spec"]["gateway"]["port"] = 0
    doc["spec"]["pools"][0]["replicas"]["min"] = 1
    (tmp / "endpoint.yaml").write_text(yaml.safe_dump(doc))
    with EndpointProcess(tmp / "endpoint.yaml", tmp, start_timeout_s=300) as ep:
        yield ep


def _clips(lang: str) -> list[Path]:
    import pytest_audioeval

    d = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / lang
    return [w for w in sorted(d.glob("*.wav")) if w.stem not in COUNTING]


@pytest.mark.parametrize("lang", LANGUAGES)
def test_each_language_comes_back_in_its_language_and_script(base, lang):
    for wav in _clips(lang):
        r = httpx.post(base.url + "/v1/audio/transcriptions", files={"file": (wav.name, wav.read_bytes())},
                       data={"model": MODEL, "response_format": "verbose_json"}, timeout=120)
        assert r.status_code == 200, r.text
        body, ref = r.json(), wav.with_suffix(".txt").read_text().strip()
        assert body["language"] == lang and 0 < body["language_probability"] <= 1, (wav.name, body)
        assert jiwer.cer(_norm(ref), _norm(body["text"]) or "-") <= MAX_CER, (wav.name, body["text"], ref)
        if lang in ("ja", "zh"):
            assert CJK.search(body["text"]), (wav.name, body["text"])  # in its script, not romanized


def test_a_named_language_is_used_and_an_unknown_one_is_a_400(base):
    (wav,) = [w for w in _clips("fr") if w.stem == "bonjour_monde"]
    with httpx.Client(base_url=base.url, timeout=120) as c:
        ok = c.post("/invocations", content=wav.read_bytes(), headers={"Content-Type": "audio/wav"})
        fr = c.post("/v1/audio/transcriptions", files={"file": (wav.name, wav.read_bytes())},
                    data={"model": MODEL, "language": "fr", "response_format": "verbose_json"})
        bad = c.post("/v1/audio/transcriptions", files={"file": (wav.name, wav.read_bytes())},
                     data={"model": MODEL, "language": "xx"})
    assert _norm(ok.json()["transcribe_text"]) == "bonjour le monde"
    assert fr.status_code == 200 and fr.json()["language"] == "fr"
    assert "language_probability" not in fr.json()  # named, not detected
    assert bad.status_code == 400 and "language 'xx' is not supported" in bad.json()["message"]
    assert "fr" in bad.json()["message"] and "ja" in bad.json()["message"]  # it names the languages it can do


@pytest.mark.parametrize("lang,clip", [("fr", "bonjour_monde"), ("ja", "konnichiwa_sekai"), ("zh", "nihao_shijie")])
def test_translation_returns_english_on_every_api(base, lang, clip):
    (wav,) = [w for w in _clips(lang) if w.stem == clip]
    audio = wav.read_bytes()
    import base64

    with httpx.Client(base_url=base.url, timeout=120) as c:
        oa = c.post("/v1/audio/translations", files={"file": (wav.name, audio)},
                    data={"model": MODEL, "response_format": "verbose_json"})
        sm = c.post("/invocations", json={"audio_data": base64.b64encode(audio).decode(), "task": "translate"})
        ks = c.post(f"/v2/models/{MODEL}/infer", json={"inputs": [
            {"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(audio).decode()]},
            {"name": "TASK", "datatype": "BYTES", "shape": [1], "data": ["translate"]}]})
    assert oa.status_code == 200 and oa.json()["task"] == "translate" and oa.json()["language"] == lang, oa.text
    assert ks.json()["parameters"]["language"] == lang and 0 < ks.json()["parameters"]["language_probability"] <= 1
    for text in (oa.json()["text"], sm.json()["transcribe_text"], ks.json()["outputs"][0]["data"][0]):
        # English, from French, Japanese and Chinese speech. The Chinese greeting's second word
        # turns on the CPU's int8 kernels: CTranslate2 takes Intel MKL's on Intel CPUs ("Hello
        # world") and oneDNN's on AMD ones ("Hello, everyone.").
        want = {"hello"} if lang == "zh" else {"hello", "world"}
        assert want <= set(_norm(text).split()) and not CJK.search(text), (clip, text)
