"""The clients users already have, unmodified, against a running gateway (issue 17): Triton's
model configuration, statistics and repository index through ``tritonclient.http``; the
SageMaker runtime API through boto3 ``invoke_endpoint``; OpenAI ``models.retrieve``."""

from __future__ import annotations

import base64
import io
import json
import math

import boto3
import botocore.config
import botocore.exceptions
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from audio import wer

MODEL = "whisper-tiny.en"
MAX_WER = 0.15


def _sagemaker(url: str, **kw):
    # Any credentials: tideserve does not verify SigV4 (README, "SageMaker runtime").
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x",
                        aws_secret_access_key="x", config=botocore.config.Config(retries={"max_attempts": 0}), **kw)


def test_triton_config_stats_and_repository_index(endpoint, en_clips):
    client = triton.InferenceServerClient(url=f"127.0.0.1:{endpoint.port}", network_timeout=120)
    config = client.get_model_config(MODEL)
    assert config["name"] == MODEL and config["max_batch_size"] == 0
    assert config["platform"] == client.get_model_metadata(MODEL)["platform"] == "faster-whisper"
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("AUDIO", "TYPE_STRING", [1]), ("PROMPT", "TYPE_STRING", [1]), ("LANGUAGE", "TYPE_STRING", [1]),
        ("TASK", "TYPE_STRING", [1])]
    assert [t["name"] for t in config["output"]] == ["TEXT"]
    assert config["instance_group"] == [{"name": "cpu", "kind": "KIND_CPU", "count": 2}]

    before = client.get_inference_statistics(MODEL)["model_stats"][0]
    audio = triton.InferInput("AUDIO", [1], "BYTES")
    audio.set_data_from_numpy(np.array([en_clips[0].wav], dtype=np.object_), binary_data=True)
    client.infer(MODEL, [audio])
    with pytest.raises(triton.InferenceServerException, match="not served here"):
        client.infer("whisper-large", [audio])  # another model's request is not this one's failure
    after = client.get_inference_statistics(MODEL)["model_stats"][0]
    assert after["inference_stats"]["fail"] == before["inference_stats"]["fail"]
    assert after["name"] == MODEL and after["version"] == "1"
    assert after["inference_count"] == before["inference_count"] + 1
    ok, ok0 = after["inference_stats"]["success"], before["inference_stats"]["success"]
    assert ok["count"] == ok0["count"] + 1 and ok["ns"] > ok0["ns"]
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    assert after["last_inference"] >= before["last_inference"] and after["last_inference"] > 0
    assert client.get_inference_statistics()["model_stats"][0]["name"] == MODEL  # all models

    index = client.get_model_repository_index()
    assert index == [{"name": MODEL, "version": "1", "state": "READY", "reason": ""}]
    with pytest.raises(triton.InferenceServerException, match="not served here"):
        client.get_model_config("whisper-large")


def test_sagemaker_runtime_invoke_endpoint_raw_audio_and_json(endpoint, en_clips):
    client = _sagemaker(endpoint.url)
    clip = en_clips[0]
    raw = client.invoke_endpoint(EndpointName="whisper", Body=clip.wav, ContentType="audio/wav")
    body = json.loads(raw["Body"].read())
    assert raw["ContentType"].startswith("application/json")
    assert body["code"] == 0 and wer(clip.reference, body["transcribe_text"]) <= MAX_WER

    doc = {"audio_data": base64.b64encode(clip.wav).decode(), "whisper_prompt": ""}
    js = json.loads(client.invoke_endpoint(EndpointName="whisper", Body=json.dumps(doc),
                                           ContentType="application/json")["Body"].read())
    assert js["transcribe_text"] == body["transcribe_text"]

    with pytest.raises(botocore.exceptions.ClientError) as err:
        client.invoke_endpoint(EndpointName="nope", Body=clip.wav, ContentType="audio/wav")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(botocore.exceptions.ClientError) as err:
        client.invoke_endpoint(EndpointName="whisper", Body=b"not audio", ContentType="audio/wav")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_openai_models_retrieve_and_the_whisper_1_alias(endpoint, en_clips):
    client = openai.OpenAI(base_url=endpoint.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model" and model.owned_by == "tideserve"
    assert [m.id for m in client.models.list()] == [MODEL, "whisper-1"]  # the example's alias
    assert client.models.retrieve("whisper-1").id == "whisper-1"
    clip = en_clips[0]
    text = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", io.BytesIO(clip.wav))).text
    assert wer(clip.reference, text) <= MAX_WER  # OpenAI code that names whisper-1 runs unmodified
    meta = triton.InferenceServerClient(url=f"127.0.0.1:{endpoint.port}").get_model_metadata("whisper-1")
    assert meta["name"] == MODEL  # the alias reaches the model on KServe too
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("whisper-2")


def test_openai_streaming_sends_a_delta_per_window_then_the_whole_text(endpoint, long_clip):
    client = openai.OpenAI(base_url=endpoint.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    events = list(client.audio.transcriptions.create(
        model=MODEL, file=("long.wav", io.BytesIO(long_clip.wav)), stream=True))
    assert [e.type for e in events[-1:]] == ["transcript.text.done"]
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    text = events[-1].text
    # About 40 s: one stretch of two windows, each window's text sent as it is accepted (before,
    # a stretch's text came in one delta when it was complete).
    assert len(deltas) >= math.ceil(long_clip.duration_s / 30) >= 2
    assert "".join(deltas) == text
    assert wer(long_clip.reference, text) <= MAX_WER


def test_openai_streaming_errors_before_the_first_delta_are_plain_errors(endpoint, en_clips):
    client = openai.OpenAI(base_url=endpoint.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError, match="not a supported audio file"):
        list(client.audio.transcriptions.create(model=MODEL, file=("x.wav", io.BytesIO(b"not audio")), stream=True))
    with pytest.raises(openai.BadRequestError, match="use response_format json or text"):
        client.audio.transcriptions.create(model=MODEL, file=("a.wav", io.BytesIO(en_clips[0].wav)), stream=True,
                                           response_format="srt")


def test_word_timestamps_are_monotonic_inside_the_audio_and_spell_the_text(endpoint, long_clip):
    client = openai.OpenAI(base_url=endpoint.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    result = client.audio.transcriptions.create(model=MODEL, file=("long.wav", io.BytesIO(long_clip.wav)),
                                                response_format="verbose_json", timestamp_granularities=["word"])
    words = result.words
    assert words and len(words) >= 20  # the 40 s clip, over two windows
    for w in words:
        assert 0 <= w.start <= w.end <= long_clip.duration_s + 0.01, w
    starts = [w.start for w in words]
    assert starts == sorted(starts)  # monotonic across windows
    segments = [(s.start, s.end) for s in result.segments]
    assert segments == sorted(segments) and all(0 <= a <= b <= long_clip.duration_s + 0.01 for a, b in segments)
    assert wer(result.text, "".join(w.word for w in words)) <= 0.05  # the words are the text
    with pytest.raises(openai.BadRequestError, match="needs response_format verbose_json"):
        client.audio.transcriptions.create(model=MODEL, file=("a.wav", io.BytesIO(long_clip.wav)),
                                           response_format="json", timestamp_granularities=["word"])
