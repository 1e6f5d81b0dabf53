"""KServe v2 / Open Inference Protocol (Triton's HTTP API) for a transcription model.

Tensors: input ``AUDIO`` (BYTES, shape [1]: the encoded audio file), optional input
``PROMPT`` (BYTES, shape [1]: Whisper's initial prompt, UTF-8), output ``TEXT`` (BYTES, [1]).

The binary-tensor extension is supported both ways (tritonclient uses it by default): the
``Inference-Header-Content-Length`` header gives the size of the JSON header; binary tensor
data follows it in input order, each BYTES element as a 4-byte little-endian length and the
bytes. Spec: kserve/open-inference-protocol, and Triton's ``binary_data`` extension doc.
In the plain-JSON form, BYTES elements are strings; for ``AUDIO`` the string is base64.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tideserve.errors import BadInputError
from tideserve.protocol import schemas
from tideserve.protocol.sagemaker import decode_base64, loads_json
from tideserve.protocol.text import language_code, require_text
from tideserve.protocol.types import TranscriptionRequest, TranscriptionResult, identification_fields

HEADER_LENGTH = "Inference-Header-Content-Length"
INPUT_AUDIO, INPUT_PROMPT, INPUT_LANGUAGE, INPUT_TASK, OUTPUT_TEXT = "AUDIO", "PROMPT", "LANGUAGE", "TASK", "TEXT"


def model_metadata(name: str, platform: str) -> dict:
    return {
        "name": name,
        "versions": ["1"],
        "platform": platform,
        "inputs": [
            {"name": INPUT_AUDIO, "datatype": "BYTES", "shape": [1]},
            {"name": INPUT_PROMPT, "datatype": "BYTES", "shape": [1], "optional": True},
            {"name": INPUT_LANGUAGE, "datatype": "BYTES", "shape": [1], "optional": True},
            {"name": INPUT_TASK, "datatype": "BYTES", "shape": [1], "optional": True},
        ],
        "outputs": [{"name": OUTPUT_TEXT, "datatype": "BYTES", "shape": [1]}],
    }


def server_metadata(version: str) -> dict:
    return {"name": "tideserve", "version": version, "extensions": ["binary_tensor_data"]}


def _unpack_bytes_elements(raw: bytes, tensor: str) -> list[bytes]:
    out, i = [], 0
    while i < len(raw):
        if i + 4 > len(raw):
            raise BadInputError(f"binary data of input '{tensor}' is cut inside an element length prefix")
        (n,) = struct.unpack_from("<I", raw, i)
        i += 4
        if i + n > len(raw):
            raise BadInputError(
                f"binary data of input '{tensor}' declares an element of {n} bytes but only {len(raw) - i} remain"
            )
        out.append(raw[i : i + n])
        i += n
    return out


def pack_bytes_elements(items: list[bytes]) -> bytes:
    """Serialise BYTES elements: each a uint32 little-endian length, then the bytes."""
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


@dataclass(frozen=True)
class InferRequest:
    request: TranscriptionRequest
    id: str | None
    binary_output: bool


def parse_infer(body: bytes, header_length: str | None) -> InferRequest:
    """Parse ``POST /v2/models/{name}/infer``. Raises BadInputError naming the problem; text
    (a JSON-form ``PROMPT``, a binary ``PROMPT`` once decoded, the request ``id``) must be valid
    UTF-8 text, without lone surrogates."""
    if header_length is not None:
        # ASCII digits only: int() also takes "1_0" and other scripts' digits, which no client sends
        if not (header_length.isascii() and header_length.isdigit()):
            raise BadInputError(f"{HEADER_LENGTH} must be an integer, got {header_length[:40]!r}")
        hlen = int(header_length)
        if not 0 < hlen <= len(body):
            raise BadInputError(f"{HEADER_LENGTH} is {hlen} but the body has {len(body)} bytes")
        head, binary = body[:hlen], body[hlen:]
    else:
        head, binary = body, b""
    if not head:
        raise BadInputError("empty inference request; send the KServe v2 JSON with an AUDIO input")
    data = loads_json(head, "inference request header")
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), list):
        raise BadInputError("inference request must be a JSON object with an 'inputs' list")
    schemas.validate(schemas.InferRequest, data, "the inference request")  # structure; meaning below
    if not isinstance(data.get("parameters") or {}, dict):
        raise BadInputError("'parameters' of the inference request must be an object")
    if not isinstance(data.get("outputs") or [], list):
        raise BadInputError("'outputs' of the inference request must be a list")

    values: dict[str, bytes] = {}
    offset = 0
    for i, tensor in enumerate(data["inputs"]):
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise BadInputError(f"inputs[{i}] must be an object with a 'name'")
        name = tensor["name"]
        if tensor.get("datatype") != "BYTES":
            raise BadInputError(f"input '{name}' must have datatype BYTES, got {tensor.get('datatype')!r}")
        params = tensor.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadInputError(f"'parameters' of input '{name}' must be an object")
        refuse_extensions(params, f"input '{name}'")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise BadInputError(
                    f"input '{name}' declares binary_data_size {size} but {len(binary) - offset} binary bytes remain"
                )
            elements = _unpack_bytes_elements(binary[offset : offset + size], name)
            offset += size
        else:
            raw = tensor.get("data")
            if not isinstance(raw, list):
                raise BadInputError(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
            flat = _flatten(raw)
            if not all(isinstance(x, str) for x in flat):
                raise BadInputError(f"input '{name}' data must hold strings (BYTES)")
            elements = [decode_base64(x, name) if name == INPUT_AUDIO else require_text(x, f"input {name}").encode()
                        for x in flat]
        if len(elements) != 1:
            raise BadInputError(f"input '{name}' must hold exactly 1 element (shape [1]), got {len(elements)}")
        shape = tensor.get("shape")
        if not isinstance(shape, list) or any(not isinstance(d, int) or d < 1 for d in shape) or math.prod(shape) != 1:
            raise BadInputError(f"input '{name}' has shape {shape!r} for its 1 element; send shape [1]")
        if name not in (INPUT_AUDIO, INPUT_PROMPT, INPUT_LANGUAGE, INPUT_TASK):
            raise BadInputError(f"unknown input '{name}'; this model takes {INPUT_AUDIO} and optional {INPUT_PROMPT}, "
                                f"{INPUT_LANGUAGE}, {INPUT_TASK}")
        if name in values:
            raise BadInputError(f"input '{name}' is given twice; send each input once")
        values[name] = elements[0]
    if INPUT_AUDIO not in values:
        raise BadInputError(f"missing input '{INPUT_AUDIO}' (BYTES, shape [1]: the encoded audio file)")
    try:
        prompt = values[INPUT_PROMPT].decode() if INPUT_PROMPT in values else None
    except UnicodeDecodeError:
        raise BadInputError(f"input '{INPUT_PROMPT}' must be UTF-8 text") from None
    try:
        language = language_code(values[INPUT_LANGUAGE].decode(), f"input {INPUT_LANGUAGE}") \
            if INPUT_LANGUAGE in values else None
    except UnicodeDecodeError:
        raise BadInputError(f"input '{INPUT_LANGUAGE}' must be UTF-8 text") from None
    task = values.get(INPUT_TASK, b"transcribe") or b"transcribe"
    if task not in (b"transcribe", b"translate"):
        raise BadInputError(f"input '{INPUT_TASK}' must be transcribe or translate, got {task[:20]!r}")

    binary_output = bool((data.get("parameters") or {}).get("binary_data_output", False))
    refuse_outputs(len(data.get("outputs") or []))
    for out in data.get("outputs") or []:
        if not isinstance(out, dict):
            raise BadInputError("each entry of 'outputs' must be an object with a 'name'")
        if out.get("name") != OUTPUT_TEXT:
            raise BadInputError(f"unknown output '{out.get('name')}'; this model has output {OUTPUT_TEXT}")
        out_params = out.get("parameters") or {}
        if not isinstance(out_params, dict):
            raise BadInputError(f"'parameters' of output '{OUTPUT_TEXT}' must be an object")
        refuse_extensions(out_params, f"output '{OUTPUT_TEXT}'")
        if "binary_data" in out_params:
            binary_output = bool(out_params["binary_data"])
    req_id = require_text(data["id"], "id") if isinstance(data.get("id"), str) else None
    return InferRequest(TranscriptionRequest(audio=values[INPUT_AUDIO], prompt=prompt or None, language=language,
                                             task=task.decode()), req_id, binary_output)


#: Triton's protocol extensions that a tensor's parameters can ask for and this server does not
#: implement (https://github.com/triton-inference-server/server/tree/main/docs/protocol): served as if
#: not asked, a shared-memory client would read its region, never written, as the answer.
UNSUPPORTED_EXTENSIONS = {"shared_memory_region": "shared-memory", "classification": "classification"}


def refuse_extensions(params: Mapping[str, Any], what: str) -> None:
    """BadInputError when a tensor's ``params`` (its JSON ``parameters``, or gRPC's map) ask for an
    extension of ``UNSUPPORTED_EXTENSIONS``."""
    for key, extension in UNSUPPORTED_EXTENSIONS.items():
        if key in params:
            raise BadInputError(f"{what} asks for Triton's {extension} extension ('{key}'), which this server does "
                                "not support; send the data in the request (JSON or binary_data_size) and read the "
                                "text from the answer")


def refuse_outputs(count: int) -> None:
    """BadInputError when a request asks for more than the model's one output (``TEXT``)."""
    if count > 1:
        raise BadInputError(f"'outputs' names {count} outputs; this model has one, {OUTPUT_TEXT}: ask for it once")


def _flatten(x: list) -> list:
    """Elements of a nested list, depth first (iterative: no recursion limit to hit)."""
    out, stack = [], [iter(x)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


def format_infer(
    model_name: str, req: InferRequest, result: TranscriptionResult
) -> tuple[bytes, dict[str, str], str]:
    """(body, extra headers, content type) of the inference response."""
    text = result.text.encode()
    head: dict = {"model_name": model_name, "model_version": "1", "outputs": [],
                  "parameters": {"language": result.language}}  # response parameters (KServe v2)
    if result.language_probability is not None:
        head["parameters"]["language_probability"] = round(result.language_probability, 4)
    head["parameters"].update(identification_fields(result))
    if req.id is not None:
        head["id"] = req.id
    out: dict = {"name": OUTPUT_TEXT, "datatype": "BYTES", "shape": [1]}
    if req.binary_output:
        payload = pack_bytes_elements([text])
        out["parameters"] = {"binary_data_size": len(payload)}
        head["outputs"].append(out)
        js = json.dumps(head).encode()
        return js + payload, {HEADER_LENGTH: str(len(js))}, "application/octet-stream"
    out["data"] = [result.text]
    head["outputs"].append(out)
    return json.dumps(head).encode(), {}, "application/json"


# --- Triton's model configuration, statistics and repository extensions ---------------------
# Shapes: triton-inference-server/server docs/protocol/extension_model_configuration.md,
# extension_statistics.md and extension_model_repository.md (JSON of model_config.proto).


def model_config(name: str, backend: str, max_batch_size: int, max_queue_delay_ms: float,
                 pools: list[tuple[str, str, int]]) -> dict:
    """``GET /v2/models/{name}/config`` in Triton's JSON form of ``ModelConfig``.

    ``max_batch_size`` in Triton's sense is 0: clients send one request of shape [1] (the
    batching across requests is the server's, given in ``parameters``). ``pools`` are
    ``(name, accelerator, max replicas)``: one ``instance_group`` each (KIND_CPU for cpu)."""
    tensor = {"data_type": "TYPE_STRING", "format": "FORMAT_NONE", "dims": [1], "is_shape_tensor": False}
    return {
        "name": name, "platform": backend, "backend": backend,  # as model_metadata's platform
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 0,
        "input": [{"name": INPUT_AUDIO, **tensor, "optional": False},
                  {"name": INPUT_PROMPT, **tensor, "optional": True},
                  {"name": INPUT_LANGUAGE, **tensor, "optional": True},
                  {"name": INPUT_TASK, **tensor, "optional": True}],
        "output": [{"name": OUTPUT_TEXT, "data_type": "TYPE_STRING", "dims": [1], "label_filename": ""}],
        "instance_group": [{"name": pool, "kind": "KIND_CPU" if accel == "cpu" else "KIND_GPU", "count": count}
                           for pool, accel, count in pools],
        "parameters": {"tideserve_max_batch_size": {"string_value": str(max_batch_size)},
                       "tideserve_max_queue_delay_ms": {"string_value": f"{max_queue_delay_ms:g}"}},
    }


def parse_repository_index(body: bytes) -> bool:
    """Whether ``POST /v2/repository/index``'s body (empty, or a JSON object) asks for ready models
    only (``{"ready": true}``). Raises BadInputError for another body, or for a key that misspells
    ``ready`` (``schemas.nested_key_error``: ``{"redy": true}`` would list every model)."""
    try:
        doc = json.loads(body) if body.strip() else {}
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("ready", False), bool):
        raise BadInputError('the repository index request must be empty or a JSON object such as {"ready": true}')
    if (msg := schemas.nested_key_error(schemas.RepositoryIndexRequest, doc, "the repository index request")) is not None:
        raise BadInputError(msg)
    return bool(doc.get("ready", False))


def repository_index(name: str, ready: bool, ready_only: bool = False) -> list[dict]:
    """``POST /v2/repository/index``: the one model, READY or UNAVAILABLE (``ready_only``:
    Triton's ``{"ready": true}`` filter)."""
    if ready_only and not ready:
        return []
    return [{"name": name, "version": "1", "state": "READY" if ready else "UNAVAILABLE",
             "reason": "" if ready else "no pool can serve requests (see /admin/status)"}]


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)


class InferenceStats:
    """Per-model inference statistics as Triton's statistics extension reports them
    (``GET /v2/models/{name}/stats``), counted over every inference API.

    ``success(total_s, queue_s, compute_s, at_s)``: an answered request, its end-to-end time,
    its time held for a replica (Triton's queue) and its compute time at the replica (seconds);
    ``at_s`` is the wall-clock time (Unix seconds) for ``last_inference``. ``failure(total_s)``:
    any other answer."""

    def __init__(self) -> None:
        self.ok, self.fail, self.queue, self.compute = _Duration(), _Duration(), _Duration(), _Duration()
        self.last_inference_ms = 0

    def success(self, total_s: float, queue_s: float, compute_s: float | None, at_s: float) -> None:
        self.ok.add(total_s)
        self.queue.add(queue_s)
        if compute_s is not None:
            self.compute.add(compute_s)
        self.last_inference_ms = int(at_s * 1000)

    def failure(self, total_s: float) -> None:
        self.fail.add(total_s)

    def to_json(self, name: str) -> dict:
        zero = {"count": 0, "ns": 0}
        return {"model_stats": [{
            "name": name, "version": "1", "last_inference": self.last_inference_ms,
            "inference_count": self.ok.count, "execution_count": self.ok.count,
            "inference_stats": {
                "success": vars(self.ok).copy(), "fail": vars(self.fail).copy(), "queue": vars(self.queue).copy(),
                "compute_input": dict(zero), "compute_infer": vars(self.compute).copy(), "compute_output": dict(zero),
                "cache_hit": dict(zero), "cache_miss": dict(zero),
            },
            "batch_stats": [],
        }]}


# --- the same inference over gRPC (the gateway's gRPC front forwards it as HTTP) -----------


def binary_infer_body(request_id: str, inputs: list[tuple[str, str, list[int], bytes]]) -> tuple[bytes, int]:
    """An HTTP ``/infer`` body in the binary-tensor form: ``inputs`` are ``(name, datatype,
    shape, elements)`` where ``elements`` are BYTES elements serialized as ``pack_bytes_elements``
    does (the layout of gRPC's ``raw_input_contents``); TEXT is asked for as binary. Returns
    (body, the JSON header's length for ``Inference-Header-Content-Length``). The receiver's
    ``parse_infer`` validates it."""
    head = {"id": request_id,
            "inputs": [{"name": n, "datatype": d, "shape": list(s), "parameters": {"binary_data_size": len(raw)}}
                       for n, d, s, raw in inputs],
            "outputs": [{"name": OUTPUT_TEXT, "parameters": {"binary_data": True}}]}
    js = json.dumps(head).encode()
    return js + b"".join(raw for *_, raw in inputs), len(js)


def parse_binary_infer_response(body: bytes, header_length: str | None) -> bytes:
    """The serialized ``TEXT`` elements (``pack_bytes_elements`` layout) of an ``/infer``
    response asked for as binary (``binary_infer_body``). Raises ValueError when the body is
    not such a response."""
    if header_length is None:
        raise ValueError(f"the response has no {HEADER_LENGTH} header")
    n = int(header_length)
    head = json.loads(body[:n])
    offset = n
    for out in head.get("outputs") or []:
        size = int((out.get("parameters") or {}).get("binary_data_size", 0))
        if out.get("name") == OUTPUT_TEXT:
            return body[offset:offset + size]
        offset += size
    raise ValueError(f"the response has no {OUTPUT_TEXT} output")
