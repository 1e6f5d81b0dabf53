"""Issue 15: a worker answered 500 to a non-UTF-8 X-Tideserve-Token, and /ping, /metrics and
/v2/health/* answered anyone. Now every route but the liveness probe needs the gateway's token
(in X-Tideserve-Token, or as a Bearer credential for Prometheus); a malformed one is 401."""

from __future__ import annotations

import asyncio
import os
import sys
import types

import pytest
from aiohttp import web

from tideserve.metrics.triton import TritonMetrics
from tideserve.worker.api import WorkerService, build_app

TOKEN = "gw-token-123"


async def _raw(port: int, path: str, token: bytes | None) -> bytes:
    """GET ``path``; ``token`` as ``X-Tideserve-Token``, or a whole ``Authorization`` value when it
    starts with b"Authorization: "."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if token is not None and token.startswith(b"Authorization: "):
        head += token + b"\r\n"
    elif token is not None:
        head += b"X-Tideserve-Token: " + token + b"\r\n"
    writer.write(head + b"\r\n")
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


def _statuses(requests: list[tuple[str, bytes | None]], probe_envs: list[dict] | None = None) -> list[int]:
    """Status of each GET in ``requests`` against a worker app with TOKEN; then the exit code of
    ``python -m tideserve.worker.probe`` run with each of ``probe_envs`` added to the env."""

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
            got = [int((await _raw(port, path, tok)).split(b" ", 2)[1]) for path, tok in requests]
            for env in probe_envs or []:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "tideserve.worker.probe", "--port", str(port),
                    env={**{k: v for k, v in os.environ.items() if k != "TIDESERVE_WORKER_TOKEN"}, **env},
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
                got.append(await asyncio.wait_for(proc.wait(), 60))
            return got
        finally:
            await runner.cleanup()

    return asyncio.run(main())


@pytest.mark.parametrize("token", [b"\xff\xfe", b"gw-token-123\xc3", b"\xc3\xa9t\xc3\xa9"])
def test_malformed_or_non_ascii_token_is_401_not_500(token):
    assert _statuses([("/v1/models", token), ("/ping", token)]) == [401, 401]


def test_only_the_gateway_token_opens_every_route_but_liveness():
    got = _statuses([
        ("/ping", None), ("/v1/models", None), ("/v2", None), ("/v2/models/m", None), ("/admin/worker", None),
        ("/v2/health/ready", None), ("/metrics", None), ("/v2/models/m/ready", None),
        ("/ping", b"wrong"), ("/ping", TOKEN.encode()), ("/v1/models", TOKEN.encode()),
        ("/v2/health/ready", TOKEN.encode()), ("/metrics", TOKEN.encode()),
        ("/v2/health/live", None),
    ])
    assert got == [401] * 9 + [200] * 5


def test_prometheus_bearer_credential_opens_metrics_and_a_wrong_one_does_not():
    got = _statuses([
        ("/metrics", b"Authorization: Bearer " + TOKEN.encode()),
        ("/metrics", b"Authorization: bearer " + TOKEN.encode()),
        ("/metrics", b"Authorization: Bearer wrong"),
        ("/metrics", b"Authorization: Basic " + TOKEN.encode()),
        ("/metrics", b"Authorization: Bearer \xff\xfe"),
    ])
    assert got == [200, 200, 401, 401, 401]


def test_the_kubernetes_readiness_probe_sends_the_token_from_the_env():
    assert _statuses([], probe_envs=[{"TIDESERVE_WORKER_TOKEN": TOKEN}, {}, {"TIDESERVE_WORKER_TOKEN": "wrong"}]) == [0, 1, 1]
