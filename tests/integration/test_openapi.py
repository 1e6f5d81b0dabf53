"""``/openapi.json`` (OpenAPI 3.1) describes every route of the gateway and of the worker, built
from the routes they registered and the body schemas their parsers validate with; schemathesis
generates requests for every operation from it against a running gateway: no server error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from jsonschema.validators import Draft202012Validator

from tideserve.protocol import openapi, schemas

MODEL = "whisper-tiny.en"


def _gateway_routes() -> set[tuple[str, str]]:
    return {("GET", "/ping"), ("POST", "/invocations"), ("POST", "/endpoints/{endpoint}/invocations"),
            ("GET", "/v2/health/live"), ("GET", "/v2/health/ready"), ("GET", "/v2"), ("GET", "/v2/models/stats"),
            ("POST", "/v2/repository/index"), ("POST", "/v1/audio/transcriptions"), ("POST", "/v1/audio/translations"),
            ("GET", "/v1/models"),
            ("GET", "/v1/models/{model}"), ("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/admin/status"),
            ("GET", "/admin/sd")} | {
        (m, p + s) for p in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")
        for m, s in (("GET", ""), ("GET", "/ready"), ("POST", "/infer"), ("GET", "/config"), ("GET", "/stats"))}


def _operations(doc: dict) -> set[tuple[str, str]]:
    return {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}


def test_the_gateway_document_lists_every_route_with_the_parsers_schemas(endpoint):
    doc = httpx.get(endpoint.url + "/openapi.json", timeout=10).json()
    assert doc["openapi"] == "3.1.0" and doc["info"]["title"].startswith("tideserve gateway")
    assert _operations(doc) == _gateway_routes()
    infer = doc["paths"]["/v2/models/{name}/infer"]["post"]
    assert infer["parameters"][0]["schema"]["enum"] == [MODEL, "whisper-1"]  # the model and its alias
    assert infer["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/InferRequest"}
    components = doc["components"]["schemas"]
    assert components["InvocationRequest"] == schemas.InvocationRequest.model_json_schema(
        ref_template="#/components/schemas/{model}")
    for schema in components.values():
        Draft202012Validator.check_schema(schema)


def test_the_worker_document_lists_its_routes(endpoint, en_clips):
    with endpoint.client(timeout=120) as c:  # a replica is up (the endpoint scales from zero)
        assert c.post("/invocations", content=en_clips[0].wav, headers={"Content-Type": "audio/wav"}).status_code == 200
        target = c.get("/admin/sd").json()[0]["targets"][0]
    doc = httpx.get(f"http://{target}/openapi.json", headers={"X-Tideserve-Token": endpoint.worker_token},
                    timeout=10).json()
    assert doc["info"]["title"].startswith("tideserve worker")
    gateway_only = {("POST", "/endpoints/{endpoint}/invocations"), ("GET", "/v2/models/stats"),
                    ("POST", "/v2/repository/index"), ("GET", "/admin/status"), ("GET", "/admin/sd")} | {
        ("GET", p + s) for p in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")
        for s in ("/config", "/stats")}
    assert _operations(doc) == (_gateway_routes() - gateway_only) | {("GET", "/admin/worker"), ("POST", "/internal/part")}


def test_an_undocumented_route_is_an_error():
    with pytest.raises(openapi.UndocumentedRouteError, match="/v3/new"):
        openapi.document([("GET", "/ping"), ("GET", "/v3/new")], "t", "1")


def test_schemathesis_finds_no_server_error(endpoint, tmp_path):
    """Every operation, from the document: examples, coverage of edge values and random data
    for 25 s; a 5xx fails (502/503/504 are not expected here: one idle replica, no kills)."""
    st = str(Path(sys.executable).parent / "st")
    run = subprocess.run([st, "run", endpoint.url + "/openapi.json", "--checks", "not_a_server_error",
                          "--max-time", "25", "--workers", "1", "--max-response-time", "60"],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    tail = run.stdout[-3000:]
    assert run.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail.split("Test cases:")[-1], tail
