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
    status, body = asyncio.run(_post("/pin"))
    assert body["message"] == "no route for POST /pin; did you mean /ping?"
    status, body = asyncio.run(_post("/something/else"))  # nothing near: no guess
    assert status == 404 and body["message"] == "no route for POST /something/else"
