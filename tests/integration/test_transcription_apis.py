"""Real speech through the gateway, with each API's own client used unmodified."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import tritonclient.http as triton
from audio import Clip, wer

MAX_WER = 0.15


def _clips(en_clips: list[Clip], long_clip: Clip) -> list[Clip]:
    return [*en_clips, long_clip]


def test_sagemaker_invocations(endpoint, en_clips, long_clip):
    with endpoint.client() as c:
        for clip in _clips(en_clips, long_clip):
            r = c.post("/invocations", json={"audio_data": base64.b64encode(clip.wav).decode(), "whisper_prompt": ""})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["code"] == 0 and body["message"] == "Success"
            assert wer(clip.reference, body["transcribe_text"]) <= MAX_WER, (clip.name, body["transcribe_text"])
            assert r.headers["X-Request-Id"]


def test_sagemaker_prompt_is_whisper_initial_prompt(endpoint, en_clips):
    """whisper_prompt conditions decoding: a prompt written in digits makes the counting
    clip come out in digits, and the plain request writes it in words."""
    counting = next(c for c in en_clips if c.name == "counting")
    audio = base64.b64encode(counting.wav).decode()
    with endpoint.client() as c:
        plain = c.post("/invocations", json={"audio_data": audio}).json()["transcribe_text"]
        styled = c.post("/invocations", json={"audio_data": audio, "whisper_prompt": "1, 2, 3, 4, 5"}).json()["transcribe_text"]
    assert not any(ch.isdigit() for ch in plain), plain
    assert sum(ch.isdigit() for ch in styled) >= 10, styled
    assert wer(counting.reference, styled) <= MAX_WER


def test_kserve_v2_with_tritonclient(endpoint, en_clips, long_clip):
    client = triton.InferenceServerClient(url=f"127.0.0.1:{endpoint.port}", network_timeout=120, connection_timeout=10)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("whisper-tiny.en")  # at zero replicas too: requests are held
    meta = client.get_model_metadata("whisper-tiny.en")
    assert [i["name"] for i in meta["inputs"]] == ["AUDIO", "PROMPT", "LANGUAGE", "TASK"]
    for clip in _clips(en_clips, long_clip):
        audio = triton.InferInput("AUDIO", [1], "BYTES")
        audio.set_data_from_numpy(np.array([clip.wav], dtype=np.object_), binary_data=True)
        out = triton.InferRequestedOutput("TEXT", binary_data=True)
        result = client.infer("whisper-tiny.en", [audio], outputs=[out], request_id=f"r-{clip.name}")
        text = result.as_numpy("TEXT")[0].decode()
        assert wer(clip.reference, text) <= MAX_WER, (clip.name, text)
        assert result.get_response()["id"] == f"r-{clip.name}"


def test_kserve_json_output_and_prompt_tensor(endpoint, en_clips):
    client = triton.InferenceServerClient(url=f"127.0.0.1:{endpoint.port}", network_timeout=120)
    clip = en_clips[0]
    audio = triton.InferInput("AUDIO", [1], "BYTES")
    audio.set_data_from_numpy(np.array([clip.wav], dtype=np.object_), binary_data=True)
    prompt = triton.InferInput("PROMPT", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b""], dtype=np.object_), binary_data=False)
    result = client.infer("whisper-tiny.en", [audio, prompt], outputs=[triton.InferRequestedOutput("TEXT", binary_data=False)])
    text = result.get_response()["outputs"][0]["data"][0]
    assert "parameters" not in result.get_response()["outputs"][0]  # JSON, not binary
    assert wer(clip.reference, text) <= MAX_WER


def test_openai_client(endpoint, en_clips, long_clip):
    client = openai.OpenAI(base_url=endpoint.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    for clip in _clips(en_clips, long_clip):
        result = client.audio.transcriptions.create(
            model="whisper-tiny.en", file=(f"{clip.name}.wav", io.BytesIO(clip.wav)), language="en", prompt=""
        )
        assert wer(clip.reference, result.text) <= MAX_WER, (clip.name, result.text)


def test_openai_verbose_json_segments(endpoint, long_clip):
    client = openai.OpenAI(base_url=endpoint.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    result = client.audio.transcriptions.create(
        model="whisper-tiny.en", file=("long.wav", io.BytesIO(long_clip.wav)), response_format="verbose_json"
    )
    assert result.duration == pytest.approx(long_clip.duration_s, abs=0.05)
    assert result.language == "en"
    assert wer(long_clip.reference, result.text) <= MAX_WER
    starts = [s.start for s in result.segments]
    assert len(result.segments) >= 4
    assert starts == sorted(starts)
    assert all(s.end > s.start for s in result.segments)
    assert result.segments[-1].end > 30, "segments of the second 30 s window carry its offset"
    assert result.segments[-1].end <= long_clip.duration_s + 0.05


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt", "json"])
def test_openai_response_formats(endpoint, en_clips, fmt):
    fox = next(c for c in en_clips if c.name == "quick_brown_fox")
    with endpoint.client() as c:
        r = c.post("/v1/audio/transcriptions", data={"model": "whisper-tiny.en", "response_format": fmt},
                   files={"file": ("fox.wav", fox.wav, "audio/wav")})
    assert r.status_code == 200, r.text
    if fmt == "json":
        assert wer(fox.reference, r.json()["text"]) <= MAX_WER
    elif fmt == "text":
        assert r.headers["content-type"].startswith("text/plain")
        assert wer(fox.reference, r.text) <= MAX_WER
    elif fmt == "srt":
        lines = r.text.strip().splitlines()
        assert lines[0] == "1"
        assert lines[1].startswith("00:00:0") and " --> 00:00:0" in lines[1] and "," in lines[1]
        assert wer(fox.reference, " ".join(lines[2:])) <= MAX_WER
    else:
        assert r.text.startswith("WEBVTT\n\n00:00:0")
        assert "." in r.text.splitlines()[2]
        assert wer(fox.reference, " ".join(r.text.strip().splitlines()[3:])) <= MAX_WER


@pytest.mark.parametrize("fmt", ["flac", "mp3", "ogg", "webm"])
def test_audio_formats_through_gateway(endpoint, en_clips, fmt):
    from audio import encode

    fox = next(c for c in en_clips if c.name == "quick_brown_fox")
    data = encode(fox.samples, fmt, rate=44_100, channels=2)
    with endpoint.client() as c:
        r = c.post("/invocations", json={"audio_data": base64.b64encode(data).decode()})
    assert r.status_code == 200, r.text
    assert wer(fox.reference, r.json()["transcribe_text"]) <= MAX_WER


def test_request_id_is_kept_or_made(endpoint):
    with endpoint.client() as c:
        assert c.get("/ping", headers={"X-Request-Id": "abc-123"}).headers["X-Request-Id"] == "abc-123"
        made = c.get("/v2/health/ready").headers["X-Request-Id"]
        assert len(made) == 32
        err = c.post("/invocations", content=b"{", headers={"X-Request-Id": "bad-1"})
        assert err.headers["X-Request-Id"] == "bad-1" and err.json()["request_id"] == "bad-1"


def test_silence_is_empty_text_on_every_api(endpoint):
    """Issue 13: 10 s of digital silence came back as "You" (the model's hallucination on
    silence). Through the gateway it is "" on each API: SageMaker, KServe v2 (tritonclient) and
    OpenAI (json, text and verbose_json, the last with no segment)."""
    from audio import encode

    silence = encode(np.zeros(10 * 16_000, np.float32), "wav")
    with endpoint.client() as c:
        r = c.post("/invocations", json={"audio_data": base64.b64encode(silence).decode()})
        assert r.status_code == 200, r.text
        assert r.json()["transcribe_text"] == ""
        for fmt in ("json", "text", "verbose_json"):
            r = c.post("/v1/audio/transcriptions", data={"model": "whisper-tiny.en", "response_format": fmt},
                       files={"file": ("silence.wav", silence, "audio/wav")})
            assert r.status_code == 200, (fmt, r.text)
            if fmt == "text":
                assert r.text.strip() == ""
            else:
                assert r.json()["text"] == "", (fmt, r.json())
            if fmt == "verbose_json":
                assert r.json()["segments"] == []
    client = triton.InferenceServerClient(url=f"127.0.0.1:{endpoint.port}", network_timeout=120, connection_timeout=10)
    audio = triton.InferInput("AUDIO", [1], "BYTES")
    audio.set_data_from_numpy(np.array([silence], dtype=np.object_), binary_data=True)
    result = client.infer("whisper-tiny.en", [audio], outputs=[triton.InferRequestedOutput("TEXT", binary_data=True)])
    assert result.as_numpy("TEXT")[0].decode() == ""
