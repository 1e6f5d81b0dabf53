"""Connection-level limits for a public aiohttp server: header timeout, idle timeout and a cap
on connections per client address.

aiohttp has no timeout for reading a request's headers: its ``keepalive_timeout`` (the time a
connection may wait for its next request) defaults to 3630 s on an ``AppRunner``, and a handler
runs only once the headers are complete, so no middleware can see a client that never finishes
them (a "slowloris"). :class:`GuardedAppRunner` adds, below the application:

- a **header deadline**: a connection whose first request's line and headers are not complete
  ``header_timeout_s`` after it opened is closed (nothing is answered: there is no request);
- an **idle timeout** between requests: aiohttp's ``keepalive_timeout`` set to ``idle_timeout_s``
  (in aiohttp 3.14 it is armed when the connection opens, too, and closes a connection still
  waiting for a complete request when it fires; the next request's headers are bounded by it);
- a **cap per client address**: a connection from an IP address that already holds
  ``max_connections_per_client`` open connections is answered ``429`` with ``Retry-After``
  and closed at once, before any request is read (a client sending its request at that moment
  may see the connection reset instead).

The idle timeout while a *body* is read belongs to the handler, which reads the body: see
:func:`read_body`.

The hooks are aiohttp's own: ``Server.connection_made`` / ``connection_lost`` (each connection's
protocol calls them) and ``Server.request_factory`` (called once a request's headers are
parsed); they are wrapped on the runner's server instance.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from tideserve.errors import BadInputError, ClientTimeoutError, PayloadTooLargeError

log = logging.getLogger("tideserve.http")


class ConnectionGuard:
    """The header deadline and the per-address cap, installed on one ``aiohttp.web.Server``.

    ``header_timeout_s``: seconds from a connection's opening to its first complete request
    headers. ``max_per_client``: open connections per peer IP address (0: no cap).
    ``open_count(ip)`` and ``header_timeouts`` (connections closed by the deadline) are for
    tests and status.
    """

    def __init__(self, server: web.Server, header_timeout_s: float, max_per_client: int) -> None:
        if header_timeout_s <= 0:
            raise ValueError(f"header_timeout_s must be > 0, got {header_timeout_s}")
        if max_per_client < 0:
            raise ValueError(f"max_per_client must be >= 0, got {max_per_client}")
        self.header_timeout_s = header_timeout_s
        self.max_per_client = max_per_client
        self.header_timeouts = 0
        self.refused = 0
        self._per_ip: Counter[str] = Counter()
        self._peer: dict[Any, str] = {}  # protocol -> counted address
        self._deadline: dict[Any, asyncio.TimerHandle] = {}  # protocol -> header deadline
        self._loop = asyncio.get_running_loop()
        self._made, self._lost, self._factory = server.connection_made, server.connection_lost, server.request_factory
        # Wrapping this one Server instance's connection hooks on purpose (aiohttp has no hook for it).
        server.connection_made = self._connection_made  # type: ignore[method-assign, assignment]  # see above
        server.connection_lost = self._connection_lost  # type: ignore[method-assign, assignment]  # see above
        server.request_factory = self._request_factory

    def open_count(self, ip: str) -> int:
        return self._per_ip.get(ip, 0)

    def _connection_made(self, protocol: Any, transport: asyncio.Transport) -> None:
        self._made(protocol, transport)
        peer = transport.get_extra_info("peername")
        ip = peer[0] if isinstance(peer, tuple) and peer else None
        if ip is not None and self.max_per_client and self._per_ip[ip] >= self.max_per_client:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("client %s holds %d connections (max_connections_per_client); refusing more "
                            "(%d refused so far)", ip, self._per_ip[ip], self.refused)
            transport.write(_too_many_connections(self.max_per_client))
            transport.close()
            return
        if ip is not None:
            self._per_ip[ip] += 1
            self._peer[protocol] = ip
        self._deadline[protocol] = self._loop.call_later(self.header_timeout_s, self._header_timeout, protocol)

    def _header_timeout(self, protocol: Any) -> None:
        self._deadline.pop(protocol, None)
        self.header_timeouts += 1
        # Thinned like the refusals above: a slow-header flood must not become a log flood
        # (bench/slow_headers.py closed 5,887 of them in 2 minutes).
        if self.header_timeouts == 1 or self.header_timeouts % 1000 == 0:
            log.info("closing a connection from %s: no complete request headers within header_timeout_s=%g "
                     "(%d closed so far)", self._peer.get(protocol, "?"), self.header_timeout_s, self.header_timeouts)
        protocol.force_close()

    def _request_factory(self, message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> Any:
        handle = self._deadline.pop(protocol, None)
        if handle is not None:
            handle.cancel()
        return self._factory(message, payload, protocol, writer, task)

    def _connection_lost(self, protocol: Any, exc: BaseException | None = None) -> None:
        handle = self._deadline.pop(protocol, None)
        if handle is not None:
            handle.cancel()
        ip = self._peer.pop(protocol, None)
        if ip is not None:
            self._per_ip[ip] -= 1
            if self._per_ip[ip] <= 0:
                del self._per_ip[ip]
        self._lost(protocol, exc)


def _too_many_connections(limit: int) -> bytes:
    body = json.dumps({
        "code": "too_many_connections",
        "message": (f"this client address already holds {limit} open connections (max_connections_per_client); "
                    "reuse kept-alive connections or close idle ones, then retry"),
        "request_id": None,
    }).encode()
    return (b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class ClientProtocolErrorFilter(logging.Filter):
    """On aiohttp's server logger: a client's protocol error (a request that is not HTTP/1 at
    all, such as the HTTP/2 preface of a gRPC client sent to the HTTP port, or a body not valid
    for its Content-Encoding that aiohttp drains after the answer) becomes one WARNING line
    naming the problem, not an ERROR with a traceback; after the first, one line per
    ``every`` such records (with the count), so that a client cannot flood the log. Other
    records pass unchanged."""

    def __init__(self, every: int = 100) -> None:
        super().__init__()
        self.every, self.count = every, 0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        client_fault = isinstance(exc, HttpProcessingError | web.RequestPayloadError) or isinstance(
            getattr(exc, "__cause__", None), HttpProcessingError)
        if not client_fault:
            return True
        self.count += 1
        if self.count != 1 and self.count % self.every:
            return False
        text = f"{getattr(exc, 'message', '')} {getattr(exc, 'headers', '') or ''}"
        if "PRI" in text:
            hint = "an HTTP/2 (gRPC) client on the HTTP port; Triton's gRPC protocol is on spec.gateway.grpc_port"
        elif isinstance(exc, web.RequestPayloadError) or "encoding" in str(exc).lower():
            hint = "a body not valid for its Content-Encoding"
        else:
            hint = "not a valid HTTP/1 request"
        record.msg, record.args = "refused a bad request (%s; %d so far): %s", (hint, self.count, str(exc).strip()[:200])
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info, record.exc_text = None, None
        return True


_PROTOCOL_FILTER = ClientProtocolErrorFilter()


class GuardedAppRunner(web.AppRunner):
    """An ``AppRunner`` with :class:`ConnectionGuard` on its server and aiohttp's
    ``keepalive_timeout`` set to ``idle_timeout_s``. After ``setup()``, ``guard`` is the guard.
    Other keyword arguments go to ``AppRunner``. Raises ValueError for a timeout <= 0 or a
    negative cap."""

    def __init__(self, app: web.Application, *, header_timeout_s: float, idle_timeout_s: float,
                 max_connections_per_client: int, **kwargs: Any) -> None:
        if idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        super().__init__(app, keepalive_timeout=idle_timeout_s, **kwargs)
        server_log = logging.getLogger("aiohttp.server")
        if _PROTOCOL_FILTER not in server_log.filters:
            server_log.addFilter(_PROTOCOL_FILTER)
        self._header_timeout_s = header_timeout_s
        self._max_per_client = max_connections_per_client
        self.guard: ConnectionGuard | None = None

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        self.guard = ConnectionGuard(server, self._header_timeout_s, self._max_per_client)
        return server


async def read_body(request: web.Request, max_bytes: int, idle_timeout_s: float) -> bytes:
    """The request body, read as it arrives (decompressed, when it has a Content-Encoding).
    Raises PayloadTooLargeError past ``max_bytes`` (declared or received), ClientTimeoutError
    (408) when no byte arrives for ``idle_timeout_s`` seconds, and BadInputError when the body
    cannot be read (not valid for its Content-Encoding, a broken chunked encoding)."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise PayloadTooLargeError(
            f"request body of {request.content_length} bytes is larger than max_body_bytes={max_bytes}")
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            async with asyncio.timeout(idle_timeout_s):
                chunk = await request.content.readany()
        except (web.RequestPayloadError, HttpProcessingError) as exc:
            encoding = request.headers.get("Content-Encoding")
            hint = f"; it is sent with Content-Encoding: {encoding}, so it must be valid {encoding}" if encoding else ""
            raise BadInputError(f"the request body cannot be read ({str(exc).strip()}){hint}") from None
        except TimeoutError:
            raise ClientTimeoutError(
                f"no byte of the request body arrived for idle_timeout_s={idle_timeout_s:g} s after {size} bytes; "
                "send the body without pauses") from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLargeError(f"request body is larger than max_body_bytes={max_bytes}")
        chunks.append(chunk)
