"""A request for a path no route serves is a JSON 404 that names the nearest route."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tideserve.httpcommon import request_id_and_errors


def _app() -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(middlewares=[request_id_and_errors])
    app.router.add_post("/v1/audio/transcriptions", ok)
    app.router.add_post("/v2/models/{name}/infer", ok)
    app.router.add_get("/ping", ok)
    return app


async def _post(path: str) -> tuple[int, dict]:
    async with TestClient(TestServer(_app())) as client:
        resp = await client.post(path)
        return resp.status, await resp.json()


def test_a_near_miss_path_is_answered_with_the_route_it_likely_meant():
    # Found by a new user's try: POST /v1/transcriptions was a bare "no route" 404.
    status, body = asyncio.run(_post("/v1/transcriptions"))
    assert status == 404 and body["code"] == "not_found"
    assert body["message"] == "no route for POST /v1/transcriptions; did you mean /v1/audio/transcriptions?"
    # An adversarial helper's findings: a route with a parameter was compared as its template (so
    # /v2/models/whisper-1/infe got no hint), the method was not heeded (POST /pin -> GET /ping),
    # and another API's path was offered (/v2/model -> /v1/models).
    status, body = asyncio.run(_post("/v2/models/whisper-1/infe"))
    assert body["message"] == "no route for POST /v2/models/whisper-1/infe; did you mean /v2/models/{name}/infer?"
    status, body = asyncio.run(_post("/pin"))
    assert body["message"] == "no route for POST /pin"  # /ping takes GET only
    status, body = asyncio.run(_post("/v2/audio/transcriptions"))
    assert body["message"] == "no route for POST /v2/audio/transcriptions"  # not a v1 route
    status, body = asyncio.run(_post("/something/else"))  # nothing near: no guess
    assert status == 404 and body["message"] == "no route for POST /something/else"
