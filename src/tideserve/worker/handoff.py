"""The handoff socket: prep processes send decoded audio straight to the engine process.

One AF_UNIX stream socket per replica, in a private temporary directory, carrying
``multiprocessing.connection`` messages (pickled tuples) after its HMAC challenge in both
directions (``deliver_challenge``/``answer_challenge``, the handshake ``multiprocessing``'s own
``Listener``/``Client`` run): only a process given the replica's authkey can send.

What the listener guarantees against any local process that can reach the socket (issue 12;
found by adversarial testing): a peer that connects and says nothing, sends a bad length or a
truncated message, or floods connections only loses its own connections. Each handshake runs in
the connection's own thread under a deadline (``HANDSHAKE_TIMEOUT_S``; the socket is shut down
when it passes), at most ``MAX_PENDING_HANDSHAKES`` at once (more are closed at once), and the
accept loop goes on after any error until the listener is closed. ``multiprocessing``'s
``Listener`` instead ran the handshake inside ``accept`` with no deadline and a backlog of 1: one
idle connection stopped every new prep process from connecting, and a bad length ended the
accept thread for good. On the client side ``connect`` bounds the connect and the handshake the
same way, so a prep process that cannot reach the engine fails (503) instead of hanging.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any, TypeVar

log = logging.getLogger("tideserve.worker.handoff")

#: Seconds a connection may take to complete the HMAC handshake (a local peer answers in
#: microseconds; the deadline only ends stalled or hostile connections).
HANDSHAKE_TIMEOUT_S = 5.0
#: Connections that may be in their handshake at once; more are closed at once.
MAX_PENDING_HANDSHAKES = 32
#: The listen backlog (``multiprocessing``'s default of 1 let a burst of connects fill it).
BACKLOG = 64

T = TypeVar("T")


def _within(sock: socket.socket, seconds: float, fn: Callable[[], T]) -> T:
    """``fn()`` (blocking reads and writes on ``sock``'s connection), with ``sock`` shut down if it
    takes longer than ``seconds``: the blocked call then ends with EOFError or OSError."""
    timer = threading.Timer(seconds, _shut, args=(sock,))
    timer.daemon = True
    timer.start()
    try:
        return fn()
    finally:
        timer.cancel()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


def _server_handshake(conn: Connection, authkey: bytes) -> None:
    deliver_challenge(conn, authkey)  # the order multiprocessing's Listener.accept uses
    answer_challenge(conn, authkey)


def _client_handshake(conn: Connection, authkey: bytes) -> None:
    answer_challenge(conn, authkey)  # the order multiprocessing's Client uses
    deliver_challenge(conn, authkey)


class HandoffListener:
    """Listens on ``address`` (an AF_UNIX path) for prep processes; every message of an
    authenticated connection that is an ``("audio", ...)`` tuple goes to ``put``. Raises OSError
    if ``address`` cannot be bound."""

    def __init__(self, address: str, authkey: bytes, put: Callable[[tuple], None]) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(address)
            self._sock.listen(BACKLOG)
        except OSError:
            self._sock.close()
            raise
        self._authkey = authkey
        self._put = put
        self._closed = False
        self._pending = 0  # connections in their handshake now
        self._changed = threading.Condition()
        self.refused = 0  # connections closed unauthenticated (failed, timed out, or over the limit)
        threading.Thread(target=self._accept, name="engine-handoff", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except OSError as exc:
                if self._closed:
                    return
                # Out of file descriptors, say: not a reason to stop taking prep processes.
                log.warning("the handoff socket could not accept a connection (%s); retrying", exc)
                time.sleep(0.1)
                continue
            with self._changed:
                full = self._pending >= MAX_PENDING_HANDSHAKES
                if full:
                    self.refused += 1
                else:
                    self._pending += 1
            if full:
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock,), name="engine-handoff-reader", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        watch = sock.dup()
        conn = Connection(sock.detach())
        try:
            try:
                _within(watch, HANDSHAKE_TIMEOUT_S, lambda: _server_handshake(conn, self._authkey))
            except (AuthenticationError, EOFError, OSError, ValueError):
                with self._changed:
                    self.refused += 1
                return
            finally:
                watch.close()
                with self._changed:
                    self._pending -= 1
                    self._changed.notify_all()
            self._read(conn)
        finally:
            conn.close()

    def _read(self, conn: Connection) -> None:
        try:
            while True:
                msg: Any = conn.recv()
                if isinstance(msg, tuple) and msg and msg[0] == "audio":
                    self._put(msg)
        except (EOFError, OSError):
            pass  # the prep process ended (or was replaced), possibly mid-message
        except Exception:
            log.exception("a prep process sent a message the engine cannot read; its connection is closed")

    @property
    def pending_handshakes(self) -> int:
        return self._pending

    def wait_pending(self, at_most: int, timeout_s: float) -> bool:
        """Block until at most ``at_most`` connections are in their handshake (or ``timeout_s``
        passes); returns whether that happened (for tests and operations)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._pending <= at_most, timeout_s)

    def close(self) -> None:
        self._closed = True
        self._sock.close()


def connect(address: str, authkey: bytes, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> Connection:
    """A prep process's connection to the engine's handoff socket, authenticated both ways.
    Raises OSError (cannot connect, or the handshake did not finish within ``timeout_s``),
    EOFError, or AuthenticationError (wrong key)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(address)
        sock.settimeout(None)  # blocking again: Connection reads the descriptor directly
        watch = sock.dup()
    except BaseException:
        sock.close()
        raise
    conn = Connection(sock.detach())
    try:
        _within(watch, timeout_s, lambda: _client_handshake(conn, authkey))
    except BaseException:
        conn.close()
        raise
    finally:
        watch.close()
    return conn
