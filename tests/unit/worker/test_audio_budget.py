"""Issue 15: decoded audio held by one replica is capped (spec.gateway.max_audio_s_in_flight);
a request that would pass the cap is answered 503 with Retry-After, not queued in memory, and
the budget is given back when a request ends, whatever the outcome."""

from __future__ import annotations

import asyncio
import base64
import json
import types

import numpy as np
import pytest
from aiohttp import web

from tideserve.metrics.triton import TritonMetrics
from tideserve.protocol import TranscriptionRequest
from tideserve.worker.api import AudioBudget, WorkerService, build_app
from tideserve.worker.backends.base import WindowResult
from tideserve.worker.prep import Prepared

SR = 16_000


def test_budget_refuses_past_capacity_but_always_admits_one_file():
    b = AudioBudget(100.0)
    assert b.take(60.0) and b.take(40.0)
    assert not b.take(0.5) and b.held_s == 100.0
    b.give(60.0)
    assert b.take(50.0) and b.held_s == 90.0
    b.give(90.0)
    assert b.take(500.0)  # nothing held: one file longer than the budget still runs
    assert not b.take(1.0)
    with pytest.raises(ValueError, match="must be > 0"):
        AudioBudget(0)


class Prep:
    """Stands in for PrepPool: the body names the audio's length in seconds."""

    handoff = None  # the PCM comes back here, not through the engine's handoff socket

    async def run(self, fn, body: bytes, *args) -> Prepared:
        seconds = json.loads(body)["seconds"]
        pcm = np.ones(int(seconds * SR), np.int16)
        return Prepared(TranscriptionRequest(audio=b""), pcm, ((0, len(pcm)),))


class Engine:
    """Stands in for EngineClient: each transcription waits until released."""

    dead = False

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered: asyncio.Queue = asyncio.Queue()

    async def transcribe(self, segments, options, on_segment=None):  # EngineClient.transcribe
        self.entered.put_nowait(len(segments[0][0]) / SR)
        await self.release.wait()
        return [WindowResult(text="ok", language="en")], 0.01


def test_a_request_past_the_budget_is_503_with_retry_after_and_the_budget_comes_back():
    async def main():
        metrics = TritonMetrics("m")
        engine = Engine()
        service = WorkerService("m", Prep(), engine, metrics, max_audio_s=3600,  # type: ignore[arg-type]
                                max_audio_s_in_flight=100)
        service.state.ready = True
        runner = web.AppRunner(build_app(service, 1 << 20), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        async def post(seconds: float):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = json.dumps({"seconds": seconds, "audio_data": base64.b64encode(b"x").decode()}).encode()
            writer.write(b"POST /invocations HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            data = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            head, _, payload = data.partition(b"\r\n\r\n")
            return int(head.split(b" ", 2)[1]), head.decode(), payload

        try:
            first = asyncio.ensure_future(post(70))
            assert await asyncio.wait_for(engine.entered.get(), 10) == 70
            assert metrics.value("tideserve_worker_audio_held_seconds") == 70
            status, head, payload = await post(40)  # 70 + 40 > 100
            assert status == 503 and "Retry-After: 1" in head, head
            assert "max_audio_s_in_flight" in json.loads(payload)["message"]
            second = asyncio.ensure_future(post(30))  # 70 + 30 fits
            assert await asyncio.wait_for(engine.entered.get(), 10) == 30
            assert metrics.value("tideserve_worker_audio_held_seconds") == 100
            engine.release.set()
            assert (await first)[0] == 200 and (await second)[0] == 200
            assert metrics.value("tideserve_worker_audio_held_seconds") == 0
            assert service.budget.held_s == 0
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_the_default_budget_is_twice_max_audio_s():
    service = WorkerService("m", None, types.SimpleNamespace(dead=False), TritonMetrics("m"), max_audio_s=600)  # type: ignore[arg-type]
    assert service.budget is not None and service.budget.capacity_s == 1200
