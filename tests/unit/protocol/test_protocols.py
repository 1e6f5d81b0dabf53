from __future__ import annotations

import base64
import json
import struct

import pytest

from tideserve.errors import BadInputError, UnknownModelError
from tideserve.protocol import Segment, TranscriptionResult, kserve, openai, sagemaker
from tideserve.protocol.errors import api_family, error_body


# --- SageMaker ------------------------------------------------------------------------------
def test_invocation_parses_audio_and_prompt():
    req = sagemaker.parse_invocation(json.dumps({"audio_data": base64.b64encode(b"RIFFxx").decode(),
                                                 "whisper_prompt": "Hi"}).encode())
    assert req.audio == b"RIFFxx" and req.prompt == "Hi" and not req.timestamps


def test_invocation_empty_prompt_is_no_prompt_and_urlsafe_base64_works():
    raw = bytes(range(250, 256)) * 3
    req = sagemaker.parse_invocation(json.dumps({"audio_data": base64.urlsafe_b64encode(raw).decode().rstrip("="),
                                                 "whisper_prompt": ""}).encode())
    assert req.audio == raw and req.prompt is None


@pytest.mark.parametrize("body,words", [
    (b"", "empty request body"),
    (b"{nope", "not valid JSON"),
    (b"[1]", "must be a JSON object"),
    (b'{"x": 1}', "missing field 'audio_data'"),
    (b'{"audio_data": 5}', "'audio_data' in the request body is wrong: input should be a valid string"),
    (b'{"audio_data": "@@@@"}', "not valid base64"),
    (b'{"audio_data": "AAAA", "whisper_prompt": 3}', "'whisper_prompt' in the request body is wrong"),
])
def test_invocation_errors(body, words):
    with pytest.raises(BadInputError, match=words):
        sagemaker.parse_invocation(body)


def test_invocation_response_shape():
    assert sagemaker.format_invocation(TranscriptionResult("hi", "en", 1.0)) == {
        "code": 0, "message": "Success", "transcribe_text": "hi"}


# --- KServe v2 --------------------------------------------------------------------------------
def _binary_request(audio: bytes, prompt: bytes | None = None, binary_out: bool = True) -> tuple[bytes, str]:
    inputs, blobs = [], b""
    for name, value in (("AUDIO", audio), ("PROMPT", prompt)):
        if value is None:
            continue
        blob = kserve.pack_bytes_elements([value])
        inputs.append({"name": name, "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(blob)}})
        blobs += blob
    head = json.dumps({"id": "7", "inputs": inputs,
                       "outputs": [{"name": "TEXT", "parameters": {"binary_data": binary_out}}]}).encode()
    return head + blobs, str(len(head))


def test_kserve_binary_request_and_response_round_trip():
    body, hlen = _binary_request(b"\x00\x01audio", b"a prompt")
    parsed = kserve.parse_infer(body, hlen)
    assert parsed.request.audio == b"\x00\x01audio" and parsed.request.prompt == "a prompt"
    assert parsed.id == "7" and parsed.binary_output
    out, headers, ctype = kserve.format_infer("m", parsed, TranscriptionResult("héllo", "en", 1.0))
    n = int(headers[kserve.HEADER_LENGTH])
    head = json.loads(out[:n])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == len(out) - n
    assert struct.unpack_from("<I", out, n)[0] == len("héllo".encode()) and out[n + 4:] == "héllo".encode()
    assert head["id"] == "7" and ctype == "application/octet-stream"


def test_kserve_json_request_audio_is_base64_and_json_output():
    body = json.dumps({"inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1],
                                   "data": [base64.b64encode(b"wav").decode()]}]}).encode()
    parsed = kserve.parse_infer(body, None)
    assert parsed.request.audio == b"wav" and not parsed.binary_output
    out, headers, _ctype = kserve.format_infer("m", parsed, TranscriptionResult("t", "en", 1.0))
    assert json.loads(out)["outputs"][0]["data"] == ["t"] and headers == {}


@pytest.mark.parametrize("mutate,words", [
    (lambda b, h: (b, "abc"), "must be an integer"),
    (lambda b, h: (b, str(len(b) + 5)), "but the body has"),
    (lambda b, h: (b[:-3], h), "declares binary_data_size"),
    (lambda b, h: (b"{}", None), "'inputs' list"),
])
def test_kserve_malformed(mutate, words):
    body, hlen = _binary_request(b"audio-bytes")
    with pytest.raises(BadInputError, match=words):
        kserve.parse_infer(*mutate(body, hlen))


def test_kserve_element_longer_than_its_tensor():
    blob = struct.pack("<I", 100) + b"short"
    head = json.dumps({"inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": len(blob)}}]}).encode()
    with pytest.raises(BadInputError, match="declares an element of 100 bytes but only 5 remain"):
        kserve.parse_infer(head + blob, str(len(head)))


def test_kserve_tensor_errors():
    def req(inputs):
        return json.dumps({"inputs": inputs}).encode()
    with pytest.raises(BadInputError, match="datatype BYTES"):
        kserve.parse_infer(req([{"name": "AUDIO", "datatype": "FP32", "shape": [1], "data": [1.0]}]), None)
    with pytest.raises(BadInputError, match="exactly 1 element"):
        kserve.parse_infer(req([{"name": "AUDIO", "datatype": "BYTES", "shape": [2], "data": ["AAAA", "AAAA"]}]), None)
    with pytest.raises(BadInputError, match="unknown input 'X'"):
        kserve.parse_infer(req([{"name": "X", "datatype": "BYTES", "shape": [1], "data": ["a"]}]), None)
    with pytest.raises(BadInputError, match="missing input 'AUDIO'"):
        kserve.parse_infer(req([]), None)


# --- OpenAI ----------------------------------------------------------------------------------
def test_openai_form():
    req, fmt = openai.parse_form({"model": "m", "language": "en", "prompt": "p", "response_format": "srt"}, b"wav", "m")
    assert (req.audio, req.language, req.prompt, req.timestamps, fmt) == (b"wav", "en", "p", True, "srt")
    req, fmt = openai.parse_form({"model": "m"}, b"wav", "m")
    assert fmt == "json" and not req.timestamps


@pytest.mark.parametrize("fields,file,exc,words", [
    ({"model": "m"}, None, BadInputError, "'file'"),
    ({}, b"x", BadInputError, "'model'"),
    ({"model": "other"}, b"x", UnknownModelError, "'other' is not served"),
    ({"model": "m", "response_format": "xml"}, b"x", BadInputError, "'response_format' in the form is wrong: input should be 'json'"),
    ({"model": "m", "temperature": "0.7"}, b"x", BadInputError, "temperature 0"),
    ({"model": "m", "temperature": "hot"}, b"x", BadInputError, "'temperature' in the form is wrong: input should be a valid number"),
    ({"model": "m", "language": "english!"}, b"x", BadInputError, "ISO-639-1"),
])
def test_openai_form_errors(fields, file, exc, words):
    with pytest.raises(exc, match=words):
        openai.parse_form(fields, file, "m")


def test_an_unknown_model_is_answered_with_the_served_name_and_its_aliases():
    # Found by a new user's try: the answer named only the model, not the whisper-1 alias that
    # OpenAI clients use (and the README's examples).
    with pytest.raises(UnknownModelError) as err:
        openai.parse_form({"model": "whisper-2"}, b"x", "whisper-tiny.en", aliases=("whisper-1",))
    assert str(err.value) == "model 'whisper-2' is not served here; this endpoint serves 'whisper-tiny.en' " \
                             "(also as 'whisper-1')"
    with pytest.raises(UnknownModelError, match=r"serves 'm'$"):
        openai.models_response("m", "other")
    # An adversarial helper's: a model name of 10 MB came back in full, twice, in a 20 MB answer.
    with pytest.raises(UnknownModelError) as err:
        openai.parse_form({"model": "x" * 10_000_000}, b"x", "m")
    assert str(err.value) == "model '" + "x" * 80 + "... (10000000 characters)' is not served here; this endpoint serves 'm'"


RESULT = TranscriptionResult("Hello world. Bye.", "en", 3661.5, [
    Segment(0.0, 1.25, " Hello world."), Segment(3600.5, 3661.5, " Bye.", window_start_s=3598.25, temperature=0.2),
])


def test_srt():
    assert openai.to_srt(RESULT) == (
        "1\n00:00:00,000 --> 00:00:01,250\nHello world.\n\n"
        "2\n01:00:00,500 --> 01:01:01,500\nBye.\n"
    )


def test_vtt():
    assert openai.to_vtt(RESULT) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.250\nHello world.\n\n01:00:00.500 --> 01:01:01.500\nBye.\n"
    )


def test_verbose_json_and_text():
    body, ctype = openai.format_response(RESULT, "verbose_json")
    data = json.loads(body)
    assert ctype == "application/json" and data["duration"] == 3661.5 and data["language"] == "en"
    assert [(s["id"], s["start"], s["end"]) for s in data["segments"]] == [(0, 0.0, 1.25), (1, 3600.5, 3661.5)]
    # seek: where the decode that wrote the segment started, in 10 ms mel frames (was always 0);
    # temperature: that decode's (was always 0.0).
    assert [(s["seek"], s["temperature"]) for s in data["segments"]] == [(0, 0.0), (359825, 0.2)]
    assert "detected_language" not in data and "language_mismatch" not in data  # no identifier ran
    assert openai.format_response(RESULT, "text") == (b"Hello world. Bye.\n", "text/plain; charset=utf-8")


# --- errors ------------------------------------------------------------------------------------
def test_error_bodies_per_api():
    assert api_family("/v2/models/x/infer") == "kserve" and api_family("/v1/audio/transcriptions") == "openai"
    assert api_family("/invocations") == "sagemaker" and api_family("/endpoints/whisper/invocations") == "sagemaker"
    assert api_family("/admin/status") == "admin" and api_family("/nowhere") == "admin"
    assert error_body("kserve", "bad_input", "m", "r")["error"] == "m"
    assert error_body("openai", "bad_input", "m", "r")["error"]["message"] == "m"
    assert error_body("sagemaker", "bad_input", "m", "r", 400) == {
        "code": 400, "error": "bad_input", "message": "m", "request_id": "r"}  # one type for code: 0 on success
    assert error_body("admin", "not_found", "m", "r", 404) == {"code": "not_found", "message": "m", "request_id": "r"}


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"a":' * 50_000, b'{"audio_data": 1' + b"0" * 5000 + b"}"])
def test_pathological_json_is_bad_input(body):
    with pytest.raises(BadInputError):
        sagemaker.parse_invocation(body)


@pytest.mark.parametrize("doc,words", [
    ({"inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1], "parameters": [1], "data": ["AAAA"]}]},
     "'inputs.0.parameters' in the inference request is wrong: input should be a valid dictionary"),
    ({"inputs": [], "parameters": "x"}, "'parameters' in the inference request is wrong"),
    ({"inputs": [], "outputs": 5}, "'outputs' in the inference request is wrong: input should be a valid list"),
    ({"inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": ["AAAA"]}],
      "outputs": [{"name": "TEXT", "parameters": ["binary_data"]}]}, "'outputs.0.parameters' in the inference request"),
    ({"inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": ["AAAA"]}], "outputs": [5]}, "'outputs.0' in"),
    ({"inputs": [{"name": "AUDIO", "datatype": "BYTES", "data": ["AAAA"]}]}, "missing field 'inputs.0.shape'"),
])
def test_kserve_wrong_types_are_bad_input(doc, words):
    with pytest.raises(BadInputError, match=words):
        kserve.parse_infer(json.dumps(doc).encode(), None)


def test_kserve_deeply_nested_data_is_flattened_without_recursion():
    nested = "[" * 5000 + '"AAAA"' + "]" * 5000
    body = ('{"inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": ' + nested + "}]}").encode()
    try:
        parsed = kserve.parse_infer(body, None)
    except BadInputError as e:  # the JSON parser itself may refuse the depth
        assert "too deeply" in str(e)
    else:
        assert parsed.request.audio == b"\x00\x00\x00"


def test_openai_5xx_errors_are_server_errors():
    assert error_body("openai", "unavailable", "m", "r", 503)["error"]["type"] == "server_error"
    assert error_body("openai", "bad_input", "m", "r", 400)["error"]["type"] == "invalid_request_error"


# --- text fields (issue 15: a lone surrogate gave 500 after the encoder ran) -------------------
_AUDIO_B64 = base64.b64encode(b"RIFFxx").decode()


@pytest.mark.parametrize("prompt", ["\\ud800", "ok \\udfff end", "\\udbff\\udbff"])
def test_invocation_lone_surrogate_prompt_is_bad_input(prompt):
    body = ('{"audio_data": "' + _AUDIO_B64 + '", "whisper_prompt": "' + prompt + '"}').encode()
    with pytest.raises(BadInputError, match=r"'whisper_prompt' is not valid text: character .* lone UTF-16 surrogate"):
        sagemaker.parse_invocation(body)


def test_invocation_surrogate_pair_is_text():
    body = ('{"audio_data": "' + _AUDIO_B64 + '", "whisper_prompt": "\\ud83d\\ude00"}').encode()
    assert sagemaker.parse_invocation(body).prompt == "\U0001f600"


def test_invocation_surrogate_in_audio_data_is_bad_input():
    with pytest.raises(BadInputError, match="'audio_data' in the request body holds text that is not valid"):
        sagemaker.parse_invocation(b'{"audio_data": "AA\\ud800AA"}')


def test_a_key_with_a_lone_surrogate_is_bad_input_that_says_so():
    # An adversarial helper's finding: such a key far from any field was answered "'' in the
    # request body is wrong: input should be a valid string ...", naming no place.
    with pytest.raises(BadInputError) as exc:
        sagemaker.parse_invocation(('{"audio_data": "' + _AUDIO_B64 + '", "\\ud800zzzzzz": 1}').encode())
    assert str(exc.value) == ("a key of the request body holds text that is not valid ('\\ud800zzzzzz': a lone "
                              "surrogate, or bytes that are not UTF-8); send keys and values as UTF-8 text")
    body = ('{"inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": ["' + _AUDIO_B64 + '"], '
            '"\\udc00k": 1}]}').encode()
    with pytest.raises(BadInputError, match=r"^'inputs\.0' in the inference request holds text that is not valid"):
        kserve.parse_infer(body, None)


def test_kserve_json_prompt_with_lone_surrogate_is_bad_input():
    body = ('{"inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": ["' + _AUDIO_B64 + '"]},'
            ' {"name": "PROMPT", "datatype": "BYTES", "shape": [1], "data": ["\\ud800"]}]}').encode()
    with pytest.raises(BadInputError, match="'input PROMPT' is not valid text"):
        kserve.parse_infer(body, None)


def test_kserve_binary_prompt_encoding_a_surrogate_is_bad_input():
    body, hlen = _binary_request(b"RIFFxx", prompt=b"\xed\xa0\x80")  # CESU-style U+D800: not UTF-8
    with pytest.raises(BadInputError, match="must be UTF-8 text"):
        kserve.parse_infer(body, hlen)


def test_kserve_request_id_with_lone_surrogate_is_bad_input():
    body = ('{"id": "\\udc80", "inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": ["'
            + _AUDIO_B64 + '"]}]}').encode()
    with pytest.raises(BadInputError, match="'id' is not valid text"):
        kserve.parse_infer(body, None)


@pytest.mark.parametrize("field", ["prompt", "model", "language", "response_format", "temperature", "other"])
def test_openai_text_fields_with_lone_surrogate_are_bad_input(field):
    fields = {"model": "whisper-tiny.en", field: "x\ud800"}
    with pytest.raises(BadInputError, match=f"'form field {field}' is not valid text: character 1"):
        openai.parse_form(fields, b"RIFF", "whisper-tiny.en")


def test_task_on_every_api():
    audio = base64.b64encode(b"RIFF").decode()
    assert sagemaker.parse_invocation(json.dumps({"audio_data": audio, "task": "translate"}).encode()).task == "translate"
    with pytest.raises(BadInputError, match="'task' in the request body is wrong"):
        sagemaker.parse_invocation(json.dumps({"audio_data": audio, "task": "summarize"}).encode())
    doc = {"inputs": [{"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": [audio]},
                      {"name": "TASK", "datatype": "BYTES", "shape": [1], "data": ["translate"]}]}
    assert kserve.parse_infer(json.dumps(doc).encode(), None).request.task == "translate"
    doc["inputs"][1]["data"] = ["summarize"]
    with pytest.raises(BadInputError, match="'TASK' must be transcribe or translate"):
        kserve.parse_infer(json.dumps(doc).encode(), None)
    req, _ = openai.parse_form({"model": "m"}, b"x", "m", task="translate")
    assert req.task == "translate"
    assert json.loads(openai.format_response(RESULT, "verbose_json", "translate")[0])["task"] == "translate"


def test_raw_audio_invocations_and_the_api_key_in_custom_attributes():
    assert sagemaker.parse_invocation(b"RIFF....", "audio/wav").audio == b"RIFF...."
    assert sagemaker.parse_invocation(b"\x00\x01", "application/octet-stream; x=1").audio == b"\x00\x01"
    with pytest.raises(BadInputError, match="the body is the audio file itself"):
        sagemaker.parse_invocation(b"", "audio/flac")
    with pytest.raises(BadInputError, match="not valid JSON"):
        sagemaker.parse_invocation(b"RIFF", "text/plain")  # anything else is the JSON form, as before
    get = sagemaker.api_key_from_custom_attributes
    assert get("tideserve-api-key=k1") == "k1" and get("a=b; tideserve-api-key = k2 ,c=d") == "k2"
    assert get(None) is None and get("") is None and get("tideserve-api-key=") is None and get("other=k") is None


def test_triton_repository_index_and_stats_shapes():
    assert kserve.repository_index("m", ready=False, ready_only=True) == []
    assert kserve.repository_index("m", ready=False)[0]["state"] == "UNAVAILABLE"
    stats = kserve.InferenceStats()
    stats.success(0.5, 0.1, 0.3, at_s=1000.0)
    stats.success(0.25, 0.0, None, at_s=1001.0)
    stats.failure(2.0)
    s = stats.to_json("m")["model_stats"][0]
    assert (s["inference_count"], s["last_inference"]) == (2, 1_001_000)
    assert s["inference_stats"]["success"] == {"count": 2, "ns": 750_000_000}
    assert s["inference_stats"]["fail"] == {"count": 1, "ns": 2_000_000_000}
    assert s["inference_stats"]["queue"] == {"count": 2, "ns": 100_000_000}
    assert s["inference_stats"]["compute_infer"] == {"count": 1, "ns": 300_000_000}


def test_stream_field_and_deltas_in_audio_order():
    assert openai.wants_stream({}) is False and openai.wants_stream({"stream": "true"}) is True
    with pytest.raises(BadInputError, match="stream must be true or false"):
        openai.wants_stream({"stream": "yes please"})
    with pytest.raises(BadInputError, match="'stream' in the form is wrong: string should match pattern"):
        openai.parse_form({"model": "m", "stream": "yes please"}, b"x", "m")
    with pytest.raises(BadInputError, match="use response_format json or text"):
        openai.wants_stream({"stream": "true", "response_format": "vtt"})
    order = openai.DeltaOrder()
    assert order.add(1, ["world."]) == []          # window 1 finished first: held until window 0
    assert order.add(0, ["Hello"]) == ["Hello", " world."]
    assert order.add(2, [""]) == [] and order.add(3, ["Bye."]) == [" Bye."]  # an empty window adds nothing
    assert openai.delta_event("a") == b'data: {"type": "transcript.text.delta", "delta": "a"}\n\n'


def test_a_stretchs_windows_are_sent_as_they_are_accepted_and_only_once():
    # Found by the adversarial helper: a streamed 7-minute file sent its first delta at 16.2 s
    # of 16.9 s, because a stretch (up to 75 s, several windows) was sent only when complete.
    order, sent = openai.DeltaOrder(), []

    def add(index, texts, complete=True):
        out = order.add(index, texts, complete)
        sent.extend(out)
        return out

    assert add(1, ["C."], complete=False) == []  # stretch 1 waits for stretch 0
    assert add(0, ["A."], complete=False) == ["A."]  # the first stretch's first window, at once
    assert add(0, ["A."], complete=False) == []  # sent once
    assert add(0, ["A.", "", "B."]) == [" B.", " C."]  # then stretch 1's window so far
    assert add(1, ["C.", "D."], complete=False) == [" D."]
    assert add(0, ["late"]) == []  # an index already sent whole adds nothing
    assert add(2, ["F."]) == []  # stretch 1 is not complete yet
    assert add(2, [], complete=False) == [] and add(1, ["C."], complete=False) == []  # nothing shrinks
    assert add(1, ["C.", "D.", "E."]) == [" E.", " F."]
    assert "".join(sent) == "A. B. C. D. E. F."


def test_invocation_takes_a_base64_data_uri():
    # A browser's FileReader.readAsDataURL gives "data:audio/wav;base64,..."; before, the prefix
    # made the body "not valid base64".
    raw = b"RIFF\x00\x01fake"
    b64 = base64.b64encode(raw).decode()
    req = sagemaker.parse_invocation(json.dumps({"audio_data": f"data:audio/wav;base64,{b64}"}).encode())
    assert req.audio == raw
    assert sagemaker.parse_invocation(json.dumps({"audio_data": f"DATA:;BASE64,{b64}"}).encode()).audio == raw
    with pytest.raises(BadInputError, match="data URI without ';base64,'"):
        sagemaker.parse_invocation(json.dumps({"audio_data": "data:audio/wav,RIFF"}).encode())


def test_invocation_form_urlencoded_body_says_how_to_send_a_file():
    # curl -d @clip.wav sends application/x-www-form-urlencoded: the error says what to send instead.
    with pytest.raises(BadInputError, match=r"not valid JSON.*--data-binary @clip.wav -H 'Content-Type: audio/wav'"):
        sagemaker.parse_invocation(b"RIFF\x80\x00", "application/x-www-form-urlencoded")
    with pytest.raises(BadInputError) as exc:
        sagemaker.parse_invocation(b"RIFF\x80\x00", "application/json")
    assert "--data-binary" not in str(exc.value)
    # Found by a new user's try: curl -F file=@clip.wav (the OpenAI habit) got only "not valid JSON".
    form = b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\x80\r\n--x--\r\n"
    with pytest.raises(BadInputError, match=r"no multipart form.*Content-Type audio/\*.*/v1/audio/transcriptions"):
        sagemaker.parse_invocation(form, "multipart/form-data; boundary=x")


@pytest.mark.parametrize("extra,words", [
    # Before: a misspelt or misnamed optional field was ignored, and the request served without
    # it (a misspelt language transcribed in the model's default, with a 200).
    ({"langauge": "de"}, "unknown field 'langauge' in the request body: did you mean 'language'?"),
    ({"LANGUAGE": "de"}, "did you mean 'language'?"),
    ({"languages": "de"}, "did you mean 'language'?"),  # without a language of its own
    ({"prompt": "Hi"}, "unknown field 'prompt' in the request body: this API calls it 'whisper_prompt'"),
    ({"Prompt": "Hi"}, "this API calls it 'whisper_prompt'"),
    ({"initial_prompt": "Hi"}, "this API calls it 'whisper_prompt'"),
    ({"lang": "de"}, "this API calls it 'language'"),
    # An adversarial helper's finding: another API's name written in camel case was not seen.
    ({"initialPrompt": "Hi"}, "unknown field 'initialPrompt' in the request body: this API calls it 'whisper_prompt'"),
    ({"Initial-Prompt": "Hi"}, "this API calls it 'whisper_prompt'"),
])
def test_a_misspelt_or_misnamed_field_is_refused_by_name(extra, words):
    body = json.dumps({"audio_data": base64.b64encode(b"RIFFxx").decode(), **extra}).encode()
    with pytest.raises(BadInputError, match=words.replace("?", r"\?")):
        sagemaker.parse_invocation(body)


def test_a_clients_own_keys_are_still_ignored():
    # Keys that are no slip for a field the body lacks stay a client's own business, on every API.
    # An adversarial helper found the first version (difflib's ratio >= 0.8) refusing these:
    # "uid" beside "id", "languages" beside "language", "temperature_inc", "prompt_id".
    from tideserve.protocol.schemas import InferRequest, InvocationRequest, TranscriptionForm, unknown_key_error

    audio = base64.b64encode(b"RIFFxx").decode()
    body = {"audio_data": audio, "task_id": "7", "custom_attributes": "x", "language": "en", "languages": ["en"],
            "audio_data_url": "u", "whisper_prompt_id": "p", "taskid": 1, "tsk": 2}
    assert sagemaker.parse_invocation(json.dumps(body).encode()).audio == b"RIFFxx"
    assert unknown_key_error(InvocationRequest, {"audio_data": audio, "language_code": "de"}, "x") is None
    assert unknown_key_error(InferRequest, {"inputs": [], "id": "1", "sequence_id": 3, "uid": "x", "sid": 1}, "x") is None
    assert unknown_key_error(TranscriptionForm, {"file": b"", "model": "m", "temperature": "0", "temperature_inc": "0.2",
                                                 "prompt_id": "1", "mode": "x"}, "x") is None
    assert unknown_key_error(InferRequest, {"inputs": [], "output": []}, "the request") == \
        "unknown field 'output' in the request: did you mean 'outputs'?"
    form = {"file": b"", "model": "m", "include[]": "logprobs", "chunking_strategy": "auto"}  # OpenAI SDK fields
    assert unknown_key_error(TranscriptionForm, form, "the form") is None
    assert unknown_key_error(TranscriptionForm, {**form, "languag": "en"}, "the form") == \
        "unknown field 'languag' in the form: did you mean 'language'?"
    assert unknown_key_error(TranscriptionForm, {**form, "whisper_prompt": "p"}, "the form") == \
        "unknown field 'whisper_prompt' in the form: this API calls it 'prompt'"
    assert unknown_key_error(TranscriptionForm, {**form, "timestamp_granularity": "word"}, "the form") == \
        "unknown field 'timestamp_granularity' in the form: this API calls it 'timestamp_granularities[]'"


def test_the_typo_distance_counts_a_swap_of_neighbours_as_one_edit():
    from tideserve.protocol.schemas import typo_distance

    assert [typo_distance(a, b) for a, b in [("langauge", "language"), ("Language", "language"), ("prompt_id", "prompt"),
                                             ("audioData", "audio_data"), ("", "abc"), ("ca", "abc")]] == [1, 0, 3, 1, 3, 3]


def test_only_the_first_unknown_keys_are_compared_with_the_fields():
    # A body of a million unknown keys took 8.4 s of CPU to compare (0.7 s to parse): only the
    # first MAX_KEYS_COMPARED (32) unknown keys are, so a misspelling after them is not seen.
    from tideserve.protocol.schemas import MAX_KEYS_COMPARED, InvocationRequest, unknown_key_error

    own = {f"client_key_{i}": i for i in range(MAX_KEYS_COMPARED)}
    assert MAX_KEYS_COMPARED == 32
    assert unknown_key_error(InvocationRequest, {**own, "langauge": "de"}, "x") is None
    assert unknown_key_error(InvocationRequest, {"audio_data": "A", **dict(list(own.items())[:31]), "langauge": "de"},
                             "x") == "unknown field 'langauge' in x: did you mean 'language'?"


def test_a_misspelt_key_inside_a_kserve_tensor_is_refused_with_its_place():
    # An adversarial helper's finding: keys were compared only at the top level, so "paramters" in an input
    # tensor dropped its binary_data_size silently, and in an output its binary_data (a JSON
    # answer where the client asked for binary).
    from tideserve.protocol.schemas import MAX_ITEMS_COMPARED, InferRequest, nested_key_error

    audio = {"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(b"RIFFxx").decode()]}
    for key, place in (("inputs", "inputs.0"), ("outputs", "outputs.0")):
        tensor = audio if key == "inputs" else {"name": "TEXT"}
        body = {"inputs": [audio], key: [{**tensor, "paramters": {"binary_data": True}}]}
        with pytest.raises(BadInputError) as exc:
            kserve.parse_infer(json.dumps(body).encode(), None)
        assert str(exc.value) == f"unknown field 'paramters' in the inference request ({place}): did you mean 'parameters'?"
    # tritonclient's keys and a client's own pass; only the first 16 tensors of a list are compared
    ok = {"inputs": [{**audio, "parameters": {}, "tag": 1}], "outputs": [{"name": "TEXT", "parameters": {}}], "id": "7"}
    assert kserve.parse_infer(json.dumps(ok).encode(), None).request.audio == b"RIFFxx"
    many = {"inputs": [audio] * MAX_ITEMS_COMPARED + [{**audio, "paramters": {}}]}
    assert MAX_ITEMS_COMPARED == 16 and nested_key_error(InferRequest, many, "x") is None
    many["inputs"][3] = {**audio, "paramters": {}}
    assert nested_key_error(InferRequest, many, "x") == "unknown field 'paramters' in x (inputs.3): did you mean 'parameters'?"


def test_another_apis_name_for_the_granularities_is_refused_on_the_form():
    # An adversarial helper's finding: the form always passed timestamp_granularities[] (None when
    # not sent), so the field never counted as absent and "timestamp_granularities=word" (no [])
    # was served without words, with a 200.
    fields = {"model": "whisper-tiny.en", "response_format": "verbose_json"}
    for key in ("timestamp_granularities", "timestamp_granularity"):
        with pytest.raises(BadInputError, match=r"this API calls it 'timestamp_granularities\[\]'"):
            openai.parse_form({**fields, key: "word"}, b"RIFF", "whisper-tiny.en")
    req, fmt = openai.parse_form(fields, b"RIFF", "whisper-tiny.en", granularities=["word"])
    assert req.words and fmt == "verbose_json"
    with pytest.raises(BadInputError, match=r"^form field 'file' was sent as text; attach the audio as a file upload"):
        openai.parse_form({**fields, "file": "RIFF"}, None, "whisper-tiny.en")


def test_the_binary_header_length_takes_ascii_digits_only_and_the_repository_index_its_one_key():
    # An adversarial helper's findings: int() took "1_0" and Arabic-Indic digits as lengths, and
    # {"redy": true} listed every model instead of the ready ones.
    body, _ = _binary_request(b"RIFFxx")
    for bad in ("1_0", "\u0661\u0660", " 10", "+10"):
        with pytest.raises(BadInputError, match="Inference-Header-Content-Length must be an integer"):
            kserve.parse_infer(body, bad)
    assert kserve.parse_repository_index(b"") is False and kserve.parse_repository_index(b'{"ready": true}') is True
    for key in ("redy", "Ready", "readyy"):
        with pytest.raises(BadInputError, match=f"unknown field '{key}' in the repository index request: did you mean 'ready'"):
            kserve.parse_repository_index(f'{{"{key}": true}}'.encode())
    with pytest.raises(BadInputError, match="must be empty or a JSON object"):
        kserve.parse_repository_index(b'{"ready": 1}')


def test_triton_extensions_this_server_lacks_are_refused_not_ignored():
    # An adversarial helper's finding: an output in shared memory came back inline with a 200 (a
    # shared-memory client reads its region, never written), classification was ignored, and two
    # TEXT outputs with opposite binary_data were both accepted (the last one won).
    audio = {"name": "AUDIO", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(b"RIFFxx").decode()]}
    shm = {"shared_memory_region": "out0", "shared_memory_byte_size": 64}
    for body, words in (
            ({"inputs": [audio], "outputs": [{"name": "TEXT", "parameters": shm}]},
             "output 'TEXT' asks for Triton's shared-memory extension ('shared_memory_region')"),
            ({"inputs": [{**audio, "parameters": shm}]}, "input 'AUDIO' asks for Triton's shared-memory extension"),
            ({"inputs": [audio], "outputs": [{"name": "TEXT", "parameters": {"classification": 2}}]},
             "output 'TEXT' asks for Triton's classification extension"),
            ({"inputs": [audio], "outputs": [{"name": "TEXT", "parameters": {"binary_data": True}},
                                             {"name": "TEXT", "parameters": {"binary_data": False}}]},
             "'outputs' names 2 outputs; this model has one, TEXT: ask for it once")):
        with pytest.raises(BadInputError) as exc:
            kserve.parse_infer(json.dumps(body).encode(), None)
        assert str(exc.value).startswith(words), str(exc.value)
    ok = {"inputs": [audio], "outputs": [{"name": "TEXT", "parameters": {"binary_data": True}}]}
    assert kserve.parse_infer(json.dumps(ok).encode(), None).binary_output is True
