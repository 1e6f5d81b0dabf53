"""Each kind of bad input gets a JSON error with the right 4xx status and a message naming
the problem, and the replica serves the next request."""

from __future__ import annotations

import base64

import pytest
from audio import wer


@pytest.fixture
def served_after(endpoint, en_clips):
    """After the test: a good request through the gateway still succeeds."""
    yield
    hello = next(c for c in en_clips if c.name == "hello_world")
    with endpoint.client() as c:
        r = c.post("/invocations", json={"audio_data": base64.b64encode(hello.wav).decode()})
    assert r.status_code == 200, r.text
    assert wer(hello.reference, r.json()["transcribe_text"]) <= 0.15


def _error(r, status: int, code: str, *words: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    if r.request.url.path == "/invocations":  # SageMaker style: code is always an integer
        assert body["code"] == status and body["error"] == code, body
    else:
        assert body["code"] == code, body
    for w in words:
        assert w in body["message"], body["message"]
    assert body["request_id"] == r.headers["X-Request-Id"]
    return body


def test_malformed_json(endpoint, served_after):
    with endpoint.client() as c:
        r = c.post("/invocations", content=b'{"audio_data": ', headers={"Content-Type": "application/json"})
    _error(r, 400, "bad_input", "not valid JSON")


def test_missing_audio_data(endpoint, served_after):
    with endpoint.client() as c:
        r = c.post("/invocations", json={"whisper_prompt": "hi"})
    _error(r, 400, "bad_input", "audio_data")


def test_bad_base64(endpoint, served_after):
    with endpoint.client() as c:
        r = c.post("/invocations", json={"audio_data": "this is not base64!!"})
    _error(r, 400, "bad_input", "base64")


def test_empty_audio(endpoint, served_after):
    with endpoint.client() as c:
        r = c.post("/invocations", json={"audio_data": ""})
    _error(r, 400, "bad_input", "empty")


def test_bytes_that_are_not_audio(endpoint, served_after):
    junk = base64.b64encode(b"PK\x03\x04 this is a zip file, not audio " * 50).decode()
    with endpoint.client() as c:
        r = c.post("/invocations", json={"audio_data": junk})
    _error(r, 400, "bad_input", "not a supported audio file")


def test_truncated_wav(endpoint, en_clips, served_after):
    wav = en_clips[0].wav
    with endpoint.client() as c:
        r = c.post("/invocations", json={"audio_data": base64.b64encode(wav[: len(wav) // 2]).decode()})
    _error(r, 400, "bad_input", "truncated WAV")


def test_body_over_max_body_bytes(endpoint, served_after):
    # The test endpoint sets gateway.max_body_bytes to 8 MiB.
    big = b"x" * (8 * 1024 * 1024 + 1)
    with endpoint.client() as c:
        r = c.post("/invocations", content=big, headers={"Content-Type": "application/json"})
    _error(r, 413, "too_large", "max_body_bytes")


def test_unknown_model_kserve(endpoint, en_clips, served_after):
    with endpoint.client() as c:
        r = c.post("/v2/models/whisper-large/infer", json={"inputs": []})
        meta = c.get("/v2/models/whisper-large")
    _error(r, 404, "unknown_model", "whisper-large", "whisper-tiny.en")
    assert r.json()["error"].startswith("model 'whisper-large'")  # tritonclient reads 'error'
    _error(meta, 404, "unknown_model")


def test_unknown_model_openai(endpoint, en_clips, served_after):
    with endpoint.client() as c:
        r = c.post("/v1/audio/transcriptions", data={"model": "whisper-large-v9"},
                   files={"file": ("a.wav", en_clips[0].wav, "audio/wav")})
    body = _error(r, 404, "unknown_model", "whisper-large-v9")
    assert body["error"]["code"] == "unknown_model"  # the openai client reads error.message


def test_openai_missing_file(endpoint, served_after):
    with endpoint.client() as c:
        r = c.post("/v1/audio/transcriptions", data={"model": "whisper-tiny.en"}, files={"other": ("x", b"1")})
    _error(r, 400, "bad_input", "'file'")


def test_openai_bad_response_format(endpoint, en_clips, served_after):
    with endpoint.client() as c:
        r = c.post("/v1/audio/transcriptions", data={"model": "whisper-tiny.en", "response_format": "xml"},
                   files={"file": ("a.wav", en_clips[0].wav, "audio/wav")})
    _error(r, 400, "bad_input", "response_format")


def test_kserve_missing_audio_tensor(endpoint, served_after):
    with endpoint.client() as c:
        r = c.post("/v2/models/whisper-tiny.en/infer",
                   json={"inputs": [{"name": "PROMPT", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]})
    _error(r, 400, "bad_input", "AUDIO")


def test_wrong_method(endpoint):
    with endpoint.client() as c:
        r = c.get("/invocations")
    _error(r, 405, "method_not_allowed", "POST")
    assert r.headers["Allow"] == "POST"


def test_language_the_model_does_not_know(endpoint, en_clips, served_after):
    with endpoint.client() as c:
        r = c.post("/v1/audio/transcriptions", data={"model": "whisper-tiny.en", "language": "fr"},
                   files={"file": ("a.wav", en_clips[0].wav, "audio/wav")})
    _error(r, 400, "bad_input", "language 'fr' is not supported", "which transcribes only 'en': use 'en' or leave the language out")
    # The same on the other two APIs: a "language" field in /invocations, a LANGUAGE input in KServe.
    audio = base64.b64encode(en_clips[0].wav).decode()
    with endpoint.client() as c:
        sm = c.post("/invocations", json={"audio_data": audio, "language": "fr"})
        ks = c.post("/v2/models/whisper-tiny.en/infer", json={"inputs": [
            {"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": [audio]},
            {"name": "LANGUAGE", "datatype": "BYTES", "shape": [1], "data": ["fr"]}]})
        ok = c.post("/invocations", json={"audio_data": audio, "language": "en"})
    _error(sm, 400, "bad_input", "language 'fr' is not supported", "which transcribes only 'en': use 'en' or leave the language out")
    with endpoint.client() as c:  # and an English-only model does not translate, on any API
        tr = c.post("/v1/audio/translations", data={"model": "whisper-tiny.en"},
                    files={"file": ("a.wav", en_clips[0].wav, "audio/wav")})
        tr_sm = c.post("/invocations", json={"audio_data": audio, "task": "translate"})
    _error(tr, 400, "bad_input", "is English-only and cannot translate", "examples/whisper-base.yaml")
    _error(tr_sm, 400, "bad_input", "is English-only and cannot translate")
    _error(ks, 400, "bad_input", "language 'fr' is not supported", "which transcribes only 'en': use 'en' or leave the language out")
    assert ok.status_code == 200 and ok.json()["transcribe_text"]


def test_prompt_over_the_limit(endpoint, en_clips, served_after):
    with endpoint.client() as c:
        r = c.post("/invocations", json={"audio_data": base64.b64encode(en_clips[0].wav).decode(),
                                         "whisper_prompt": "word " * 1000})
    _error(r, 400, "bad_input", "prompt is 5000 characters, over the limit of 2000")


def test_audio_over_max_audio_s(tmp_path, en_clips):
    import numpy as np
    from audio import encode
    from endpoint import EndpointProcess, write_endpoint

    path = write_endpoint(tmp_path, gateway={"max_audio_s": 10})
    silence = encode(np.zeros(16000 * 60, np.float32), "flac")  # a minute in a few kB
    with EndpointProcess(path, tmp_path) as ep, ep.client() as c:
        r = c.post("/invocations", json={"audio_data": base64.b64encode(silence).decode()})
    _error(r, 413, "too_large", "longer than the limit of 10 s")


def test_request_id_with_spaces_or_quotes_is_replaced(endpoint):
    with endpoint.client() as c:
        r = c.get("/ping", headers={"X-Request-Id": 'x" level="error'})
    assert r.headers["X-Request-Id"] != 'x" level="error' and len(r.headers["X-Request-Id"]) == 32


def test_broken_multipart_is_bad_input(endpoint, served_after):
    body = (b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\nContent-Type: text/plain; charset=bogus\r\n\r\n"
            b"whisper-tiny.en\r\n--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            b"Content-Transfer-Encoding: x-bogus\r\n\r\nRIFF\r\n--b--\r\n")
    with endpoint.client() as c:
        r = c.post("/v1/audio/transcriptions", content=body, headers={"Content-Type": "multipart/form-data; boundary=b"})
    _error(r, 400, "bad_input", "malformed multipart body")


def test_a_text_field_sent_as_a_file_is_read_and_a_file_sent_as_text_is_named(endpoint, en_clips, served_after):
    # An adversarial helper's findings: a text field sent as a file part (curl -F langauge=@x.txt)
    # was dropped silently, so its misspelling went unseen; the audio sent as a text part (curl -F
    # 'file=<clip.wav') was "malformed multipart body (UnicodeDecodeError: ...)".
    def part(name: str, value: bytes, filename: str | None = None) -> bytes:
        fn = f'; filename="{filename}"' if filename else ""
        return f'--b\r\nContent-Disposition: form-data; name="{name}"{fn}\r\n\r\n'.encode() + value + b"\r\n"
    model = part("model", b"whisper-tiny.en")
    as_file = model + part("langauge", b"de", "lang.txt") + part("file", en_clips[0].wav, "a.wav") + b"--b--\r\n"
    as_text = model + part("file", en_clips[0].wav) + b"--b--\r\n"
    with endpoint.client() as c:
        r1 = c.post("/v1/audio/transcriptions", content=as_file, headers={"Content-Type": "multipart/form-data; boundary=b"})
        r2 = c.post("/v1/audio/transcriptions", content=as_text, headers={"Content-Type": "multipart/form-data; boundary=b"})
    _error(r1, 400, "bad_input", "unknown field 'langauge' in the form: did you mean 'language'?")
    _error(r2, 400, "bad_input", "send the audio as a file upload (curl -F file=@clip.wav)")


def test_too_many_form_fields_is_json_413_not_a_crash(endpoint, served_after):
    body = ("--b\r\n" + "".join(
        f'Content-Disposition: form-data; name="f{i}"\r\n\r\n{"x" * 1000}\r\n--b\r\n' for i in range(10_000)
    ) + 'Content-Disposition: form-data; name="model"\r\n\r\nwhisper-tiny.en\r\n--b--\r\n').encode()
    assert len(body) > 8 * 1024 * 1024  # over the test endpoint's 8 MiB limit
    with endpoint.client() as c:
        r = c.post("/v1/audio/transcriptions", content=body, headers={"Content-Type": "multipart/form-data; boundary=b"})
    _error(r, 413, "too_large")


def test_unknown_route_code(endpoint):
    with endpoint.client() as c:
        r = c.get("/nope")
    _error(r, 404, "not_found", "no route")


# --- issue 15: a lone surrogate in a prompt was a 500 (after the encoder ran) -----------------
def test_lone_surrogate_prompt_is_400_on_every_api(endpoint, en_clips, served_after):
    audio = base64.b64encode(en_clips[0].wav).decode()
    with endpoint.client() as c:
        sm = c.post("/invocations", headers={"Content-Type": "application/json"},
                    content=('{"audio_data": "' + audio + '", "whisper_prompt": "\\ud800"}').encode())
        ks = c.post("/v2/models/whisper-tiny.en/infer", headers={"Content-Type": "application/json"}, content=(
            '{"inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": ["' + audio + '"]},'
            ' {"name": "PROMPT", "datatype": "BYTES", "shape": [1], "data": ["\\ud800"]}]}').encode())
        # A part's charset can make a lone surrogate too: unicode_escape turns "\ud800" into one.
        form = (b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-tiny.en\r\n'
                b'--b\r\nContent-Disposition: form-data; name="prompt"\r\nContent-Type: text/plain; charset=unicode_escape'
                b'\r\n\r\n\\ud800\r\n--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                b'Content-Type: audio/wav\r\n\r\n' + en_clips[0].wav + b'\r\n--b--\r\n')
        oa = c.post("/v1/audio/transcriptions", content=form, headers={"Content-Type": "multipart/form-data; boundary=b"})
    _error(sm, 400, "bad_input", "'whisper_prompt' is not valid text", "lone UTF-16 surrogate")
    _error(ks, 400, "bad_input", "'input PROMPT' is not valid text")
    assert ks.json()["error"].startswith("'input PROMPT'")
    body = _error(oa, 400, "bad_input")
    assert "not valid text" in body["message"] or "malformed multipart body" in body["message"], body
