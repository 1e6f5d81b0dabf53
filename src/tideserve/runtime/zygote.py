"""The runtime's side of the worker zygote (``python -m tideserve.worker.zygote``).

``Zygote.spawn`` returns a ``ForkedProcess``: the same surface the runtime uses of an
``asyncio.subprocess.Process`` (``pid``, ``returncode``, ``stdout``, ``send_signal``,
``kill``, ``wait``), so replicas forked by the zygote and replicas started as plain
subprocesses are supervised by the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

log = logging.getLogger("tideserve.runtime")


class ForkedProcess:
    def __init__(self, pid: int, stdout: asyncio.StreamReader) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._done = asyncio.Event()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        await self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()


class Zygote:
    """Start with ``await Zygote.start(preexec)``; ``spawn(argv, env)`` forks a worker."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._ready = asyncio.Event()
        self._seq = 0
        self._pending: dict[int, asyncio.Future[int]] = {}  # spawn seq -> future of the forked pid
        self._children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._reader: asyncio.Task | None = None
        self.alive = False

    async def start(self, preexec: Callable[[], None] | None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tideserve.worker.zygote", "--fd", str(theirs.fileno()),
            stdin=asyncio.subprocess.DEVNULL, pass_fds=(theirs.fileno(),), preexec_fn=preexec,
        )
        theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self.alive = True
        self._reader = asyncio.get_running_loop().create_task(self._read_events(), name="zygote-events")

    async def _read_events(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        try:
            while True:
                data = await loop.sock_recv(self._sock, 65536)
                if not data:
                    break
                msg = json.loads(data)
                op = msg.get("op")
                if op == "ready":
                    self._ready.set()
                elif op == "spawned":
                    fut = self._pending.pop(msg.get("seq"), None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg["pid"])
                    else:  # the runtime gave up on this spawn: the late fork must not live on
                        log.warning("zygote forked pid %s after its spawn timed out; killing it", msg["pid"])
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(msg["pid"], signal.SIGKILL)
                elif op == "exit":
                    child = self._children.pop(msg["pid"], None)
                    if child is not None:
                        child._exited(msg["code"])
                    else:  # exited before spawn() registered it
                        self._early_exits[msg["pid"]] = msg["code"]
        except (OSError, ValueError) as exc:
            log.warning("zygote channel failed: %s", exc)
        finally:
            if self.alive:
                log.error("the zygote exited; replicas start as fresh processes until it is restarted")
            self.alive = False
            self._ready.set()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(OSError("the zygote exited"))
            self._pending.clear()
            for child in self._children.values():  # the zygote is gone: so are its children's reports
                child._exited(-signal.SIGKILL)
            self._children.clear()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def state(self) -> str:
        if not self.alive:
            return "gone"
        return "ready" if self._ready.is_set() else "starting"

    async def wait_ready(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            return False
        return self.alive

    async def spawn(self, argv: list[str], env: dict[str, str]) -> ForkedProcess:
        """Fork a worker running ``python -m tideserve.worker`` with ``argv``. Raises OSError if
        the zygote is gone (the caller falls back to a plain subprocess)."""
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        read_fd, write_fd = os.pipe()
        self._seq += 1
        seq = self._seq
        fut: asyncio.Future[int] = loop.create_future()
        self._pending[seq] = fut
        try:
            try:
                msg = json.dumps({"op": "spawn", "seq": seq, "argv": argv, "env": env}).encode()
                await loop.run_in_executor(None, socket.send_fds, self._sock, [msg], [write_fd])
            finally:
                os.close(write_fd)
            pid = await asyncio.wait_for(fut, 10)
        except BaseException:
            self._pending.pop(seq, None)  # a late answer for this seq kills its fork
            os.close(read_fd)
            raise
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
        child = ForkedProcess(pid, reader)
        if pid in self._early_exits:
            child._exited(self._early_exits.pop(pid))
        else:
            self._children[pid] = child
        return child

    async def stop(self) -> None:
        self.alive = False  # an exit we asked for: not reported as a failure
        if self._sock is not None:
            self._sock.close()
        if self._proc is not None and self._proc.returncode is None:
            try:
                await asyncio.wait_for(self._proc.wait(), 5)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        if self._reader is not None:
            self._reader.cancel()
