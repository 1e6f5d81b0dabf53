"""The OpenAPI 3.1 document of the gateway's and the worker's HTTP routes, served at
``/openapi.json``.

``document(routes, title, version)`` describes exactly the routes a server registered (its
router is the list), each from ``OPERATIONS``; a registered route missing there is an error
(``UndocumentedRouteError``), so the document cannot fall behind the servers. Request and
response bodies are the JSON Schemas of ``protocol.schemas``, the models the parsers validate
with. Spec: https://spec.openapis.org/oas/v3.1.0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tideserve.protocol import schemas


class UndocumentedRouteError(KeyError):
    """A server registered a route that ``OPERATIONS`` does not describe."""


def _json(model: type) -> dict:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}


_ANY_JSON = {"application/json": {"schema": {"type": "object"}}}
_JSON_ARRAY = {"application/json": {"schema": {"type": "array", "items": {"type": "object"}}}}
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_AUDIO = {"audio/*": {"schema": {"type": "string", "format": "binary"}},
          "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


@dataclass(frozen=True)
class Op:
    """One operation: ``summary``, ``tag`` (the API), the request body's content types
    (``body``), the 200 answer's content types (``ok``) and its other documented statuses."""

    summary: str
    tag: str
    body: dict | None = None
    ok: dict = field(default_factory=lambda: dict(_ANY_JSON))
    errors: tuple[int, ...] = (401,)


_INFER_ERRORS = (400, 401, 404, 413, 422, 502, 503, 504)
_INVOKE = Op("Transcribe: JSON with base64 audio, or the audio file itself", "SageMaker",
             body={**_json(schemas.InvocationRequest), **_AUDIO}, ok=_json(schemas.InvocationResponse),
             errors=_INFER_ERRORS)
_INFER = Op("KServe v2 inference (AUDIO BYTES [1], optional PROMPT; binary tensor extension with "
            "Inference-Header-Content-Length)", "KServe v2",
            body={**_json(schemas.InferRequest), "application/octet-stream": {"schema": {"type": "string",
                                                                                          "format": "binary"}}},
            ok={**_json(schemas.InferResponse), "application/octet-stream": {"schema": {"type": "string",
                                                                                        "format": "binary"}}},
            errors=_INFER_ERRORS)
_MODEL = ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")

OPERATIONS: dict[tuple[str, str], Op] = {
    ("GET", "/ping"): Op("Health (SageMaker style)", "SageMaker", errors=(503,)),
    ("POST", "/invocations"): _INVOKE,
    ("POST", "/endpoints/{endpoint}/invocations"): _INVOKE,
    ("GET", "/v2/health/live"): Op("Liveness", "KServe v2", errors=()),
    ("GET", "/v2/health/ready"): Op("Readiness: requests are accepted", "KServe v2", errors=(503,)),
    ("GET", "/v2"): Op("Server metadata", "KServe v2"),
    **{("GET", p): Op("Model metadata", "KServe v2", errors=(401, 404)) for p in _MODEL},
    **{("GET", p + "/ready"): Op("Model readiness", "KServe v2", errors=(401, 404, 503)) for p in _MODEL},
    **{("POST", p + "/infer"): _INFER for p in _MODEL},
    **{("GET", p + "/config"): Op("Model configuration (Triton)", "KServe v2", errors=(401, 404)) for p in _MODEL},
    **{("GET", p + "/stats"): Op("Inference statistics (Triton)", "KServe v2", errors=(401, 404)) for p in _MODEL},
    ("GET", "/v2/models/stats"): Op("Inference statistics of every model (Triton)", "KServe v2"),
    ("POST", "/v2/repository/index"): Op("Model repository index (Triton)", "KServe v2",
                                         body=_json(schemas.RepositoryIndexRequest), ok=_JSON_ARRAY, errors=(400, 401)),
    ("POST", "/v1/audio/transcriptions"): Op(
        "Transcribe (OpenAI style); stream=true answers server-sent events", "OpenAI",
        body={"multipart/form-data": {"schema": {"$ref": "#/components/schemas/TranscriptionForm"}}},
        ok={**_json(schemas.TranscriptionJson), **_TEXT, "text/vtt": {"schema": {"type": "string"}},
            "text/event-stream": {"schema": {"type": "string"}}},
        errors=_INFER_ERRORS),
    ("POST", "/v1/audio/translations"): Op(
        "Translate into English (OpenAI style; multilingual models); stream=true answers server-sent events",
        "OpenAI", body={"multipart/form-data": {"schema": {"$ref": "#/components/schemas/TranscriptionForm"}}},
        ok={**_json(schemas.TranscriptionJson), **_TEXT, "text/vtt": {"schema": {"type": "string"}},
            "text/event-stream": {"schema": {"type": "string"}}},
        errors=_INFER_ERRORS),
    ("GET", "/v1/models"): Op("Models (OpenAI style)", "OpenAI"),
    ("GET", "/v1/models/{model}"): Op("One model (OpenAI style)", "OpenAI", errors=(401, 404)),
    ("GET", "/metrics"): Op("Prometheus metrics", "operations", ok=_TEXT),
    ("GET", "/openapi.json"): Op("This document", "operations"),
    ("GET", "/admin/status"): Op("Endpoint, pools, replicas and the autoscaler's last decision", "operations"),
    ("GET", "/admin/sd"): Op("Prometheus HTTP service discovery of the workers", "operations", ok=_JSON_ARRAY),
    ("GET", "/admin/worker"): Op("One worker's state (workers only)", "operations"),
    ("POST", "/internal/part"): Op(
        "A later part of a long file that another replica spread (workers only): multipart/form-data with the "
        "request's options as JSON in 'options' and the part, a 16 kHz mono 16-bit WAV file, in 'audio'; answers "
        "the part's full result", "operations",
        body={"multipart/form-data": {"schema": {"type": "object", "properties": {
            "options": {"type": "string"}, "audio": {"type": "string", "format": "binary"}}}}},
        errors=(400, 401, 413, 422, 503)),
}

_MODELS = (schemas.InvocationRequest, schemas.InvocationResponse, schemas.InferRequest, schemas.InferResponse,
           schemas.RepositoryIndexRequest, schemas.TranscriptionForm, schemas.TranscriptionJson, schemas.ErrorBody)


def _components() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in _MODELS:
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(js.pop("$defs", {}))
        out[model.__name__] = js
    return out


def document(routes: Iterable[tuple[str, str]], title: str, version: str,
             path_values: Mapping[str, list[str]] | None = None) -> dict:
    """The OpenAPI 3.1 document of ``routes`` (method, path; HEAD routes are left out).
    ``path_values``: the values a path parameter can take on this server (e.g. ``name``: the
    served model), published as an enum. Raises UndocumentedRouteError naming the routes
    ``OPERATIONS`` does not describe."""
    path_values = path_values or {}
    routes = sorted({(m.upper(), p) for m, p in routes if m.upper() != "HEAD"})
    missing = [r for r in routes if r not in OPERATIONS]
    if missing:
        raise UndocumentedRouteError(f"routes without an OpenAPI description: {missing}")
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    paths: dict[str, dict] = {}
    for method, path in routes:
        op = OPERATIONS[(method, path)]
        params = [{"name": n, "in": "path", "required": True,
                   "schema": {"type": "string", **({"enum": path_values[n]} if n in path_values else {})}}
                  for n in re.findall(r"{(\w+)}", path)]
        responses: dict[str, Any] = {"200": {"description": "OK", "content": op.ok}}
        for status in op.errors:
            responses[str(status)] = {"description": _REASONS[status], "content": error}
        entry: dict[str, Any] = {"summary": op.summary, "tags": [op.tag], "responses": responses,
                                 "operationId": f"{method.lower()}{re.sub(r'[^A-Za-z0-9]+', '_', path)}"}
        if params:
            entry["parameters"] = params
        if op.body is not None:
            entry["requestBody"] = {"required": True, "content": op.body}
        paths.setdefault(path, {})[method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": _components(),
                       "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        "security": [{"apiKey": []}, {}],
    }


_REASONS = {400: "Bad input", 401: "Missing or wrong API key (WWW-Authenticate: Bearer)", 404: "Unknown model or route",
            413: "Body over max_body_bytes or audio over max_audio_s",
            422: "Speech in a language the model cannot transcribe (model.language_id.on_other_language: reject)",
            502: "The replicas serving it were lost "
            "(Retry-After)", 503: "No capacity within hold_timeout_s, or not ready (Retry-After)",
            504: "Past request_timeout_s"}
