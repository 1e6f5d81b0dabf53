"""Word timestamps on a backend that cannot align words yet (torch): a clear 400 naming what to
ask instead, never a verbose_json without words (issue 16)."""

from __future__ import annotations

import asyncio
import types

import aiohttp
from aiohttp import web

from tideserve.metrics.triton import TritonMetrics
from tideserve.worker.api import WorkerService, build_app


def test_word_timestamps_on_the_torch_backend_are_a_400():
    async def main():
        service = WorkerService("m", None, types.SimpleNamespace(dead=False), TritonMetrics("m"))  # type: ignore[arg-type]
        service.state.ready = True
        runner = web.AppRunner(build_app(service, 1 << 20, None, platform="torch"), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            form = aiohttp.FormData()
            form.add_field("file", b"RIFF", filename="a.wav")
            form.add_field("model", "m")
            form.add_field("response_format", "verbose_json")
            form.add_field("timestamp_granularities[]", "word")
            async with aiohttp.ClientSession() as s, \
                    s.post(f"http://127.0.0.1:{port}/v1/audio/transcriptions", data=form) as r:
                return r.status, await r.json()
        finally:
            await runner.cleanup()

    status, body = asyncio.run(main())
    assert status == 400 and "word timestamps are not available on the torch backend" in body["message"], body
