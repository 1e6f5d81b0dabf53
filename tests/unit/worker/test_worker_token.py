"""Issue 15: a worker answered 500 to a non-UTF-8 X-Tideserve-Token, and /ping answered anyone.
Now every route but the health probes and /metrics needs the gateway's token; a malformed one is 401."""

from __future__ import annotations

import asyncio
import types

import pytest
from aiohttp import web

from tideserve.metrics.triton import TritonMetrics
from tideserve.worker.api import WorkerService, build_app

TOKEN = "gw-token-123"


async def _raw(port: int, path: str, token: bytes | None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if token is not None:
        head += b"X-Tideserve-Token: " + token + b"\r\n"
    writer.write(head + b"\r\n")
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


def _statuses(requests: list[tuple[str, bytes | None]]) -> list[int]:
    async def main():
        metrics = TritonMetrics("m")
        engine = types.SimpleNamespace(dead=False)  # the routes checked here never reach the engine
        service = WorkerService("m", None, engine, metrics)  # type: ignore[arg-type]
        service.state.ready = True
        runner = web.AppRunner(build_app(service, 1 << 20, TOKEN), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            return [int((await _raw(port, path, tok)).split(b" ", 2)[1]) for path, tok in requests]
        finally:
            await runner.cleanup()

    return asyncio.run(main())


@pytest.mark.parametrize("token", [b"\xff\xfe", b"gw-token-123\xc3", b"\xc3\xa9t\xc3\xa9"])
def test_malformed_or_non_ascii_token_is_401_not_500(token):
    assert _statuses([("/v1/models", token), ("/ping", token)]) == [401, 401]


def test_only_the_gateway_token_opens_the_routes_but_probes_and_metrics():
    got = _statuses([
        ("/ping", None), ("/v1/models", None), ("/v2", None), ("/v2/models/m", None), ("/admin/worker", None),
        ("/ping", b"wrong"), ("/ping", TOKEN.encode()), ("/v1/models", TOKEN.encode()),
        ("/v2/health/live", None), ("/v2/health/ready", None), ("/metrics", None),
    ])
    assert got == [401, 401, 401, 401, 401, 401, 200, 200, 200, 200, 200]
