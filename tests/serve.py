"""Serve an aiohttp app on a free loopback port in a test."""

from __future__ import annotations

from aiohttp import web


async def serve_app(app: web.Application, **runner_kw) -> tuple[web.AppRunner, str]:
    """Start ``app`` on 127.0.0.1 at a port the OS picks; returns its runner (``cleanup()`` it)
    and its base URL. ``runner_kw`` go to ``web.AppRunner`` (e.g. ``handler_cancellation``)."""
    runner = web.AppRunner(app, **runner_kw)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
