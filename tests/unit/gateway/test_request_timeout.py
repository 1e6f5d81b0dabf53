"""The gateway's request timeout against a replica that never answers (no machine speed involved).

This replaces an integration test that sent 5 minutes of speech to a real worker with a 1 s
timeout: whether that request was still running after 1 s depended on the CPU.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from serve import serve_app
from static_runtime import StaticRuntime, cpu_endpoint
from tideserve.gateway.app import build_gateway_app
from tideserve.replicas import ReplicaEndpoint


class OneReplica(StaticRuntime):
    def __init__(self, url: str) -> None:
        super().__init__([ReplicaEndpoint("cpu-0", "cpu", url, True, 4)])


def test_request_timeout_is_504_and_the_forwarded_request_is_cancelled():
    async def main():
        arrived, cancelled = asyncio.Event(), asyncio.Event()

        async def never_answers(request: web.Request) -> web.Response:
            arrived.set()
            try:
                await asyncio.Event().wait()  # the model never finishes
            except asyncio.CancelledError:
                cancelled.set()  # the gateway gave up and closed the connection
                raise
            raise AssertionError("unreachable")

        replica = web.Application()
        replica.router.add_post("/invocations", never_answers)
        rr, replica_url = await serve_app(replica, handler_cancellation=True)
        gw, url = await serve_app(build_gateway_app(cpu_endpoint(0.5), OneReplica(replica_url)))
        try:
            async with aiohttp.ClientSession() as s, s.post(url + "/invocations", json={"audio_data": ""}) as r:
                status, body = r.status, await r.json()
            assert arrived.is_set()
            await asyncio.wait_for(cancelled.wait(), 30)
            return status, body, gw.app["dispatcher"].in_flight(), gw.app["dispatcher"].load.answer_history()
        finally:
            await gw.cleanup()
            await rr.cleanup()

    status, body, in_flight, answers = asyncio.run(main())
    assert status == 504, body
    assert body["code"] == 504 and body["error"] == "timeout" and "request_timeout_s=0.5" in body["message"], body
    assert in_flight == 0  # the replica's slot was released
    # The autoscaler's SLO term counts it as a late answer, with the one replica ready then.
    assert [(ready, n, late) for _, ready, n, late in answers] == [(1, 1, 1)]


def test_an_answer_in_time_is_counted_for_the_slo_term():
    async def main():
        async def answers(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response({"text": "hi"})

        replica = web.Application()
        replica.router.add_post("/invocations", answers)
        rr, replica_url = await serve_app(replica)
        gw, url = await serve_app(build_gateway_app(cpu_endpoint(30), OneReplica(replica_url)))
        try:
            async with aiohttp.ClientSession() as s:
                for seconds in ("3", "600"):  # 600 s of audio: its own length sets its latency, not counted
                    async with s.post(url + "/invocations", json={"audio_data": ""},
                                      headers={"X-Audio-Seconds": seconds}) as r:
                        assert r.status == 200, await r.text()
            return gw.app["dispatcher"].load.answer_history()
        finally:
            await gw.cleanup()
            await rr.cleanup()

    assert [(ready, n, late) for _, ready, n, late in asyncio.run(main())] == [(1, 1, 0)]
