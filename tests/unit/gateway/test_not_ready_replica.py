"""A replica that answers 503 saying it is not ready (its engine died, it is draining:
``NOT_READY_HEADER``) is routed around until a health check passes again, and the request waits
for a ready replica (within hold_timeout_s) instead of failing, without that try counting. An
adversarial helper killed both engines of a two-replica pool: requests sent in the next 0.3 s got
503 in 0 ms, the gateway retrying the same two dying replicas, while their replacements were ready
1-2 s later; a second helper found the tries spent on the dying replicas left one, which a
replica past its audio budget took."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from serve import serve_app
from static_runtime import StaticRuntime, cpu_endpoint
from tideserve.gateway.app import build_gateway_app
from tideserve.protocol.internal import NOT_READY_HEADER
from tideserve.replicas import ReplicaEndpoint


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


def test_a_replica_answering_503_is_reported_and_the_request_waits_for_its_replacement():
    async def main():
        dying_hits = 0

        async def not_ready(request: web.Request) -> web.Response:
            nonlocal dying_hits
            dying_hits += 1
            await request.read()
            return web.json_response({"code": 503, "error": "capacity",
                                      "message": "replica is not ready (loading or draining); retry on another replica"},
                                     status=503, headers={"Retry-After": "1", NOT_READY_HEADER: "1"})

        async def answers(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response({"text": "served by the replacement"})

        dying, ready = web.Application(), web.Application()
        dying.router.add_post("/invocations", not_ready)
        ready.router.add_post("/invocations", answers)
        dr, dying_url = await serve_app(dying)
        rr, ready_url = await serve_app(ready)
        runtime = DyingThenReplaced(dying_url, ready_url)
        gw, url = await serve_app(build_gateway_app(cpu_endpoint(30, max_replicas=2), runtime))
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


class TwoDyingThenBudgetAndRoom(StaticRuntime):
    """Both replicas die (answer not ready); once both are reported, their replacements are ready:
    "cpu-2" is past its audio budget (503 without the not-ready header), "cpu-3" has room."""

    def __init__(self, dying_url: str, full_url: str, room_url: str) -> None:
        super().__init__([ReplicaEndpoint("cpu-0", "cpu", dying_url, True, 4),
                          ReplicaEndpoint("cpu-1", "cpu", dying_url, True, 4)])
        self.after = [ReplicaEndpoint("cpu-2", "cpu", full_url, True, 4), ReplicaEndpoint("cpu-3", "cpu", room_url, True, 4)]
        self.reported: list[str] = []

    def report_unreachable(self, replica_id):
        self.reported.append(replica_id)
        self.eps = [e if e.id != replica_id else ReplicaEndpoint(e.id, e.pool, e.url, False, 4) for e in self.eps]
        if not any(e.ready for e in self.eps):
            self.eps = self.after


def test_tries_on_replicas_that_were_not_ready_do_not_count_and_a_full_budget_is_not_reported():
    async def main():
        hits = {"dying": 0, "full": 0, "room": 0}

        async def not_ready(request: web.Request) -> web.Response:
            hits["dying"] += 1
            await request.read()
            return web.json_response({"code": 503, "message": "the engine process exited (code -9)"}, status=503,
                                     headers={"Retry-After": "1", NOT_READY_HEADER: "1"})

        async def full(request: web.Request) -> web.Response:
            hits["full"] += 1
            await request.read()
            return web.json_response({"code": 503, "message": "this replica holds 115 s of decoded audio"},
                                     status=503, headers={"Retry-After": "1"})

        async def room(request: web.Request) -> web.Response:
            hits["room"] += 1
            await request.read()
            return web.json_response({"text": "served"})

        apps = []
        for fn in (not_ready, full, room):
            app = web.Application()
            app.router.add_post("/invocations", fn)
            apps.append(await serve_app(app))
        (_, dying_url), (_, full_url), (_, room_url) = apps
        runtime = TwoDyingThenBudgetAndRoom(dying_url, full_url, room_url)
        gw, url = await serve_app(build_gateway_app(cpu_endpoint(30, max_replicas=2), runtime))
        try:
            async with aiohttp.ClientSession() as s:
                # Three requests: each meets the dying replicas or, once replaced, the two new ones
                # in the order the dispatcher picks; every one must end on the replica with room.
                out = []
                for _ in range(3):
                    async with s.post(url + "/invocations", json={"audio_data": ""}) as r:
                        out.append((r.status, await r.json()))
            return out, hits, runtime.reported
        finally:
            await gw.cleanup()
            for runner, _ in apps:
                await runner.cleanup()

    out, hits, reported = asyncio.run(main())
    assert [status for status, _ in out] == [200, 200, 200], out
    assert hits["dying"] == 2 and hits["room"] == 3
    assert reported == ["cpu-0", "cpu-1"]  # the full replica was never reported


def test_a_worker_marks_only_its_not_ready_503s():
    """The header the gateway acts on: on a ReplicaNotReadyError (and EngineDiedError, one of
    them), not on other 503s such as a full audio budget."""
    from tideserve.errors import CapacityError, ReplicaNotReadyError
    from tideserve.protocol.errors import error_response_parts
    from tideserve.worker.engine_client import EngineDiedError

    for err in (ReplicaNotReadyError("replica is not ready", retry_after_s=1),
                EngineDiedError("the engine process exited (code -9)", retry_after_s=1)):
        status, headers, _ = error_response_parts("sagemaker", err, "r1")
        assert (status, headers.get(NOT_READY_HEADER), headers["Retry-After"]) == (503, "1", "1")
    status, headers, _ = error_response_parts("sagemaker", CapacityError("past its budget", retry_after_s=1), "r1")
    assert status == 503 and NOT_READY_HEADER not in headers
