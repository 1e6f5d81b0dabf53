"""The connection guard: slow headers cut off, idle bodies answered 408, a cap per address.
Real loopback sockets against a GuardedAppRunner (asyncio.run, no plugin)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from aiohttp import web

from tideserve.errors import TideserveError
from tideserve.httpcommon import error_response
from tideserve import httpguard
from tideserve.httpguard import GuardedAppRunner, read_body
from settle import settle


def _app() -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def echo(request: web.Request) -> web.Response:
        try:
            body = await read_body(request, 1000, idle_timeout_s=0.5)
        except TideserveError as err:
            return error_response(request, err)
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/", ok)
    app.router.add_post("/echo", echo)
    return app


async def _serve(**limits) -> tuple[GuardedAppRunner, int]:
    runner = GuardedAppRunner(_app(), access_log=None, shutdown_timeout=1, **{
        "header_timeout_s": 0.5, "idle_timeout_s": 5, "max_connections_per_client": 0, **limits})
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def _closed_after(reader: asyncio.StreamReader, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    started = time.monotonic()
    data = await asyncio.wait_for(reader.read(), limit_s)
    return data, time.monotonic() - started


def test_slow_headers_are_closed_by_the_server():
    async def main():
        runner, port = await _serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
            started = time.monotonic()
            for _ in range(3):  # trickling bytes does not extend the deadline
                await asyncio.sleep(0.2)
                try:
                    writer.write(b"X-Slow: 1\r\n")
                except ConnectionError:
                    break
            data, _ = await _closed_after(reader, 5)
            assert data == b""  # closed without an answer: there was no request
            assert time.monotonic() - started < 2
            assert runner.guard is not None and runner.guard.header_timeouts == 1
            writer.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_a_prompt_client_is_not_cut_and_keeps_its_connection():
    async def main():
        runner, port = await _serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(2):
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.startswith(b"HTTP/1.1 200")
                assert await reader.readexactly(2) == b"ok"
                await asyncio.sleep(0.7)  # longer than header_timeout_s: the deadline was for the first request
            writer.close()
            assert runner.guard is not None and runner.guard.header_timeouts == 0
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_idle_connection_between_requests_is_closed():
    async def main():
        runner, port = await _serve(idle_timeout_s=0.5)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"ok"), 5)
            data, took = await _closed_after(reader, 5)  # aiohttp rounds timers up to whole seconds
            assert data == b"" and took < 3
            writer.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_a_body_that_stalls_is_408():
    async def main():
        runner, port = await _serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
            data = await asyncio.wait_for(reader.readuntil(b"}"), 5)
            assert data.startswith(b"HTTP/1.1 408"), data[:100]
            assert b"client_timeout" in data and b"idle_timeout_s=0.5" in data
            writer.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_connections_over_the_cap_per_address_get_429_and_close():
    async def main():
        runner, port = await _serve(max_connections_per_client=3, header_timeout_s=30)
        try:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            assert runner.guard is not None
            await settle(lambda: runner.guard.open_count("127.0.0.1") == 3, "3 connections accepted")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            data, _ = await _closed_after(reader, 5)
            assert data.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in data
            assert b"max_connections_per_client" in data
            writer.close()
            # Another address is not affected (127.0.0.2 is loopback too on Linux).
            r2, w2 = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            w2.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await asyncio.wait_for(r2.readuntil(b"\r\n"), 5)).startswith(b"HTTP/1.1 200")
            w2.close()
            # Closing one frees a slot.
            held[0][1].close()
            await held[0][1].wait_closed()
            await settle(lambda: runner.guard.open_count("127.0.0.1") == 2, "the closed connection forgotten")
            r3, w3 = await asyncio.open_connection("127.0.0.1", port)
            w3.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await asyncio.wait_for(r3.readuntil(b"\r\n"), 5)).startswith(b"HTTP/1.1 200")
            w3.close()
            for _, w in held[1:]:
                w.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="idle_timeout_s"):
        GuardedAppRunner(web.Application(), header_timeout_s=1, idle_timeout_s=0, max_connections_per_client=1)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_a_body_not_valid_for_its_content_encoding_is_400(encoding, caplog):
    httpguard._PROTOCOL_FILTER.count = 0

    async def main():
        runner, port = await _serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Encoding: " + encoding.encode()
                         + b"\r\nContent-Length: 5\r\nConnection: close\r\n\r\n\xff\xff\xff\xff\xff")
            data = await asyncio.wait_for(reader.read(), 5)
            assert data.startswith(b"HTTP/1.1 400"), data[:200]
            assert b"cannot be read" in data and encoding.encode() in data
            writer.close()
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.INFO, logger="aiohttp.server"):
        asyncio.run(main())
    # aiohttp drains the rest of the body after the answer and fails again: not an ERROR traceback
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text


def test_an_http2_preface_is_one_warning_line_not_a_traceback(caplog):
    httpguard._PROTOCOL_FILTER.count = 0

    async def main():
        runner, port = await _serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            head = await asyncio.wait_for(reader.read(200), 5)
            writer.close()
            return head
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.INFO, logger="aiohttp.server"):
        head = asyncio.run(main())
    assert head.startswith(b"HTTP/1.0 400")
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING and records[0].exc_info is None
    assert "spec.gateway.grpc_port" in records[0].getMessage()


def test_an_error_answer_s_reason_is_one_flat_log_field_whatever_its_api():
    # Found by a new user's try: the gateway's request log gave a 400 without its reason.
    import json

    from tideserve.httpcommon import LOG_ERROR_CHARS, error_body_message, log_error_text

    assert error_body_message(json.dumps({"error": {"message": "bad audio", "type": "x"}}).encode()) == "bad audio"
    assert error_body_message(json.dumps({"error": "no input AUDIO"}).encode()) == "no input AUDIO"  # KServe
    assert error_body_message(json.dumps({"error": "bad_input", "message": "not valid JSON"}).encode()) == "not valid JSON"
    assert error_body_message(b"<html>") is None and error_body_message(b"[1]") is None
    assert error_body_message(json.dumps({"error": {"code": 3}}).encode()) is None
    # a client's text in the message cannot start a forged line of a text log
    assert log_error_text("unknown model 'a\nfake 200 line'") == "unknown model 'a fake 200 line'"
    long = log_error_text("x" * 500)
    assert long is not None and len(long) == LOG_ERROR_CHARS and long.endswith("…")
    assert log_error_text("") is None and log_error_text(None) is None
