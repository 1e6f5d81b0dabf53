"""The engine's handoff socket against misbehaving local peers (found by adversarial testing):
an idle connection, a bad length, a truncated message, a wrong key or a flood only cost the
peer its own connection; prep processes still connect and their audio still arrives, and a
prep process facing a socket that never answers fails within its deadline instead of hanging."""

from __future__ import annotations

import os
import queue
import socket
import struct
import tempfile
import threading
from multiprocessing import AuthenticationError

import numpy as np
import pytest

from tideserve.worker import handoff
from tideserve.worker.handoff import HandoffListener, connect

KEY = b"k" * 32


@pytest.fixture()
def listener():
    d = tempfile.mkdtemp(prefix="tideserve-test-handoff-")
    address = os.path.join(d, "handoff.sock")
    got: queue.SimpleQueue = queue.SimpleQueue()
    lst = HandoffListener(address, KEY, got.put)
    yield address, got, lst
    lst.close()
    os.unlink(address)
    os.rmdir(d)


def raw(address: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(address)
    return s


def read_challenge(s: socket.socket) -> None:
    (n,) = struct.unpack("!i", s.recv(4))
    s.recv(n)


def send_audio(address: str, rid: int) -> None:
    conn = connect(address, KEY, timeout_s=10)
    conn.send(("audio", rid, np.zeros(16, np.int16), ((0, 16),), (False,)))
    conn.close()


def test_a_prep_process_connects_and_is_heard_while_another_peer_sits_idle(listener) -> None:
    address, got, _ = listener
    idle = raw(address)  # connected, never answers the challenge
    send_audio(address, 1)
    assert got.get(timeout=10)[:2] == ("audio", 1)
    idle.close()


@pytest.mark.parametrize("junk", [struct.pack("!i", 100_000), b"\x01\x02\x03"], ids=["bad length", "truncated"])
def test_a_broken_handshake_does_not_stop_the_listener(listener, junk: bytes) -> None:
    address, got, lst = listener
    s = raw(address)
    read_challenge(s)
    s.sendall(junk)
    s.close()
    send_audio(address, 2)
    assert got.get(timeout=10)[:2] == ("audio", 2)
    assert lst.wait_pending(0, timeout_s=10) and lst.refused == 1


def test_a_wrong_key_is_refused_and_others_still_connect(listener) -> None:
    address, got, _ = listener
    with pytest.raises(AuthenticationError):
        connect(address, b"x" * 32, timeout_s=10)
    send_audio(address, 3)
    assert got.get(timeout=10)[:2] == ("audio", 3)


def test_connections_past_the_handshake_limit_are_closed_not_queued(listener) -> None:
    address, got, lst = listener
    idle = [raw(address) for _ in range(handoff.MAX_PENDING_HANDSHAKES)]
    for s in idle:  # each holds a handshake slot: its challenge was sent
        read_challenge(s)
    assert lst.pending_handshakes == handoff.MAX_PENDING_HANDSHAKES
    extra = raw(address)
    extra.settimeout(10)
    assert extra.recv(4) == b""  # closed without a challenge
    for s in idle:
        s.close()
    assert lst.wait_pending(0, timeout_s=10)  # the slots come back as the idle peers leave
    send_audio(address, 4)
    assert got.get(timeout=10)[:2] == ("audio", 4)


def test_connect_gives_up_on_a_socket_that_never_answers() -> None:
    d = tempfile.mkdtemp(prefix="tideserve-test-handoff-")
    address = os.path.join(d, "silent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(4)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
    try:
        with pytest.raises((EOFError, OSError)):
            connect(address, KEY, timeout_s=0.5)  # accepted, but no challenge ever comes
    finally:
        for s in accepted:
            s.close()
        server.close()
        os.unlink(address)
        os.rmdir(d)
