"""A template process that has already imported a worker's libraries and forks replicas.

Cold start is dominated by imports here (numpy, aiohttp, CTranslate2: about 1 s of a 2 s
start on this machine, bench/cold_start.py), so the local runtime keeps one zygote per
endpoint: it imports everything once, then forks a replica per request, which only has to
load its model. Nothing runs threads or an event loop in the zygote before a fork.

Protocol on the ``SOCK_SEQPACKET`` socket given as ``--fd`` (one JSON message per packet):
- runtime -> zygote: ``{"op": "spawn", "seq": S, "argv": [...], "env": {...}}`` with one file
  descriptor attached (SCM_RIGHTS): the write end of the replica's log pipe, which becomes
  the child's stdout and stderr.
- zygote -> runtime: ``{"op": "ready"}`` once imported; ``{"op": "spawned", "seq": S, "pid": N}``
  after each fork (``seq`` echoes the spawn request's); ``{"op": "exit", "pid": N, "code": C}`` when a child ends (C < 0: killed by
  signal -C), the same convention as ``asyncio.subprocess.Process.returncode``.
The zygote exits when the socket closes; it dies with the runtime (parent-death signal).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import sys
import time

# Everything a worker imports, imported once here so that forked replicas start warm.
import tideserve.worker.server as server
from tideserve.metrics.triton import TritonMetrics  # noqa: F401
from tideserve.worker import api, timings  # noqa: F401
from tideserve.worker.backends import BACKENDS


def _pdeathsig(sig: int) -> None:
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG


def _send(sock: socket.socket, msg: dict) -> None:
    sock.send(json.dumps(msg).encode())


def _child(sock: socket.socket, wakeup_r: int, wakeup_w: int, log_fd: int, argv: list[str], env: dict) -> None:
    """In the forked child: become a worker process. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _pdeathsig(signal.SIGTERM)
        sock.close()
        os.close(wakeup_r)
        os.close(wakeup_w)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(devnull)
        os.close(log_fd)
        os.environ.clear()
        os.environ.update(env)
        code = server.main(argv, started_at=time.time())
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the replicas; the runtime stops us last
    _pdeathsig(signal.SIGTERM)
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wakeup_r, selectors.EVENT_READ)
    _send(sock, {"op": "ready", "pid": os.getpid(), "backends": sorted(BACKENDS)})
    while True:
        for key, _ in sel.select():
            if key.fileobj == wakeup_r:
                os.read(wakeup_r, 4096)
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    _send(sock, {"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})
                continue
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
            if not data:  # the runtime closed the socket: we are done
                return 0
            msg = json.loads(data)
            if msg.get("op") != "spawn" or len(fds) != 1:
                for f in fds:
                    os.close(f)
                continue
            pid = os.fork()
            if pid == 0:
                _child(sock, wakeup_r, wakeup_w, fds[0], msg["argv"], msg["env"])
            os.close(fds[0])
            _send(sock, {"op": "spawned", "seq": msg.get("seq"), "pid": pid})


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tideserve.worker.zygote")
    p.add_argument("--fd", type=int, required=True, help="SOCK_SEQPACKET socket to the runtime")
    try:
        return run(p.parse_args().fd)
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the runtime went away (stopped during start-up): nothing to report to


if __name__ == "__main__":
    raise SystemExit(main())
