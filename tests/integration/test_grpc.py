"""The KServe v2 / Triton gRPC protocol on the gateway, with the real ``tritonclient.grpc``
(issue 17): health, metadata, config, statistics, repository index, inference with BYTES
tensors, errors as gRPC status codes, API keys in metadata over TLS."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from audio import wer
from tritonclient.utils import InferenceServerException

MODEL = "whisper-tiny.en"


@pytest.fixture(scope="module")
def client(endpoint):
    port = endpoint.status()["gateway"]["grpc_port"]
    assert isinstance(port, int) and port > 0
    return tgrpc.InferenceServerClient(url=f"127.0.0.1:{port}")


def _audio(wav: bytes) -> tgrpc.InferInput:
    audio = tgrpc.InferInput("AUDIO", [1], "BYTES")
    audio.set_data_from_numpy(np.array([wav], dtype=np.object_))
    return audio


def test_health_metadata_config_and_repository_index(client):
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    assert not client.is_model_ready("whisper-large")
    assert client.get_server_metadata(as_json=True)["name"] == "tideserve"
    meta = client.get_model_metadata(MODEL, as_json=True)
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [("AUDIO", "BYTES", ["1"]),
                                                                                ("PROMPT", "BYTES", ["1"]),
                                                                                ("LANGUAGE", "BYTES", ["1"]),
                                                                                ("TASK", "BYTES", ["1"])]
    config = client.get_model_config(MODEL, as_json=True)["config"]
    assert config["name"] == MODEL and [i["data_type"] for i in config["input"]] == ["TYPE_STRING"] * 4
    assert config["instance_group"] == [{"name": "cpu", "kind": "KIND_CPU", "count": 2}]
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index == [{"name": MODEL, "version": "1", "state": "READY"}]  # empty reason is left out of JSON


def test_infer_with_bytes_tensors_and_statistics(client, en_clips):
    before = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    clip = en_clips[0]
    prompt = tgrpc.InferInput("PROMPT", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b""], dtype=np.object_))
    result = client.infer(MODEL, [_audio(clip.wav), prompt], outputs=[tgrpc.InferRequestedOutput("TEXT")],
                          request_id="grpc-1")
    text = result.as_numpy("TEXT")[0].decode()
    assert wer(clip.reference, text) <= 0.15, text
    assert result.get_response().id == "grpc-1"
    after = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    assert int(after["inference_count"]) == int(before.get("inference_count", 0)) + 1
    assert int(after["inference_stats"]["compute_infer"]["ns"]) > int(before["inference_stats"].get("compute_infer", {}).get("ns", 0))


@pytest.mark.parametrize("model,inputs,status,words", [
    ("whisper-large", None, "StatusCode.NOT_FOUND", "not served here"),
    (MODEL, "not audio", "StatusCode.INVALID_ARGUMENT", "not a supported audio file"),
    (MODEL, "no audio", "StatusCode.INVALID_ARGUMENT", "missing input 'AUDIO'"),
])
def test_errors_are_grpc_status_codes(client, en_clips, model, inputs, status, words):
    if inputs == "no audio":
        prompt = tgrpc.InferInput("PROMPT", [1], "BYTES")
        prompt.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
        tensors = [prompt]
    else:
        tensors = [_audio(b"not audio at all" if inputs == "not audio" else en_clips[0].wav)]
    with pytest.raises(InferenceServerException) as err:
        client.infer(model, tensors)
    assert err.value.status() == status and words in err.value.message()
    assert client.infer(MODEL, [_audio(en_clips[0].wav)]).as_numpy("TEXT")[0]  # and the next one is served


def _raw_stub(client_port: int):
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    return grpc.insecure_channel(f"127.0.0.1:{client_port}"), service_pb2, service_pb2_grpc


def test_malformed_and_contradictory_requests_are_invalid_argument(endpoint, en_clips):
    import grpc

    port = endpoint.status()["gateway"]["grpc_port"]
    channel, pb, pbg = _raw_stub(port)
    raw_call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=lambda x: x, response_deserializer=lambda x: x)
    with pytest.raises(grpc.RpcError) as err:
        raw_call(b"\x12\x02\xc3\x28")  # model_version: invalid UTF-8 in a proto3 string
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a valid ModelInferRequest" in err.value.details()
    stub = pbg.GRPCInferenceServiceStub(channel)
    wav = en_clips[0].wav

    def request(**kw):
        r = pb.ModelInferRequest(model_name=MODEL, id="grpc-meta-test" if kw.pop("with_id", False) else "")
        t = r.inputs.add(name="AUDIO", datatype="BYTES", shape=kw.pop("shape", [1]))
        if kw.pop("inline", False):
            t.contents.bytes_contents.append(wav)
        r.raw_input_contents.append(len(wav).to_bytes(4, "little") + wav)
        for name in kw.pop("outputs", []):
            out = r.outputs.add(name=name)
            if kw.get("shm"):
                out.parameters["shared_memory_region"].string_param = "out0"
        kw.pop("shm", None)
        if kw.pop("twice", False):
            r.inputs.add(name="AUDIO", datatype="BYTES", shape=[1])
            r.raw_input_contents.append(len(wav).to_bytes(4, "little") + wav)
        return r

    for kw, words in (({"inline": True}, "both contents and raw_input_contents"),
                      ({"outputs": ["NOPE"]}, "unknown output 'NOPE'"),
                      ({"shape": [2]}, "send shape [1]"),
                      ({"twice": True}, "given twice"),
                      # an output in shared memory came back inline (an adversarial helper's finding)
                      ({"outputs": ["TEXT"], "shm": True}, "output 'TEXT' asks for Triton's shared-memory extension"),
                      ({"outputs": ["TEXT", "TEXT"]}, "'outputs' names 2 outputs")):
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request(**kw), timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in err.value.details(), (kw, err.value)
    answer, call = stub.ModelInfer.with_call(request(), metadata=(("x-request-id", "from-metadata-1"),), timeout=60)
    assert dict(call.trailing_metadata())["x-request-id"] == "from-metadata-1" and answer.raw_output_contents
    channel.close()


def test_a_request_past_its_deadline_counts_as_a_failure_not_a_success(client, endpoint, long_clip):
    import grpc

    def counts() -> tuple[int, int]:
        s = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]["inference_stats"]
        return int(s.get("success", {}).get("count", 0)), int(s.get("fail", {}).get("count", 0))

    ok0, fail0 = counts()
    port = endpoint.status()["gateway"]["grpc_port"]
    channel, pb, pbg = _raw_stub(port)
    r = pb.ModelInferRequest(model_name=MODEL)
    r.inputs.add(name="AUDIO", datatype="BYTES", shape=[1]).contents.bytes_contents.append(long_clip.wav)
    with pytest.raises(grpc.RpcError) as err:
        pbg.GRPCInferenceServiceStub(channel).ModelInfer(r, timeout=0.3)  # the 40 s clip takes seconds
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    channel.close()
    deadline = time.monotonic() + 30  # the gateway accounts it when its handler is cancelled
    while counts()[1] == fail0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counts() == (ok0, fail0 + 1)
