"""The HTTP front's side of the engine process: start it, send it windows, await results.

The engine process (``worker.engine.engine_main``) is forked from the front at start, before
the front runs any thread, so it inherits the imported libraries (a zygote-forked replica
starts warm) and no lock held by another thread. Messages go through two ``multiprocessing``
pipes; a reader thread in the front blocks on the engine's pipe and hands each message to the
event loop. If the engine process dies, every waiting request fails with ``EngineDiedError``
(503, retry elsewhere) and ``dead`` is set, so the worker exits and its runtime restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import itertools
import multiprocessing
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence

from tideserve.errors import (
    BadInputError,
    EngineMismatchError,
    LanguageMismatchError,
    PayloadTooLargeError,
    MissingExtraError,
    ReplicaNotReadyError,
    SourceError,
    SpecError,
    TideserveError,
)
from tideserve.worker.backends.base import WindowResult
from tideserve.worker.engine import EngineConfig, EngineStats, RequestOptions, engine_main


class EngineDiedError(ReplicaNotReadyError):
    """The engine process exited while requests were waiting on it."""


class EngineLoadError(TideserveError):
    """The engine could not load its model (not a mismatch or spec error): ``kind`` names the
    exception it raised."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


_LOAD_ERRORS: dict[str, type[TideserveError]] = {
    "EngineMismatchError": EngineMismatchError,
    "SpecError": SpecError,
    "SourceError": SourceError,
    "MissingExtraError": MissingExtraError,
}
_REQUEST_ERRORS: dict[str, type[TideserveError]] = {
    "BadInputError": BadInputError,
    "PayloadTooLargeError": PayloadTooLargeError,
    "LanguageMismatchError": LanguageMismatchError,
}


def _engine_entry(inbox: Any, outbox: Any, config: EngineConfig) -> None:
    """In the forked engine process: detach from the front's signal set-up, die with it."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the front, which stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    engine_main(inbox, outbox, config)


#: ``on_segment(index, results, complete)``: a segment's window results so far, in order;
#: ``complete`` False for a streamed request's partial chain (``RequestOptions.stream``), whose
#: results stay: later calls for the same index only add to them.
OnSegment = Callable[[int, list[WindowResult], bool], None]


@dataclass
class _Pending:
    future: asyncio.Future
    segments: int
    results: dict[int, list[WindowResult]] = field(default_factory=dict)
    compute_s: float = 0.0
    on_segment: OnSegment | None = None


class EngineClient:
    """Start the engine process for ``config``; ``on_stats(EngineStats)`` receives its counters.

    ``handoff`` (default on): the engine also listens on a Unix socket in a private temporary
    directory (``handoff``: its ``(path, authkey)``, for ``PrepPool(handoff=...)``), so that prep
    processes send decoded audio to it directly and this process never carries PCM."""

    def __init__(self, config: EngineConfig, on_stats: Callable[[EngineStats], None] | None = None,
                 handoff: bool = True) -> None:
        self._handoff_dir: str | None = None
        if handoff and config.handoff is None:
            self._handoff_dir = tempfile.mkdtemp(prefix="tideserve-engine-")
            config = dataclasses.replace(config, handoff=(os.path.join(self._handoff_dir, "handoff.sock"),
                                                          secrets.token_bytes(32)))
        self.handoff = config.handoff
        ctx = multiprocessing.get_context("fork")
        to_engine_r, self._to_engine = ctx.Pipe(duplex=False)
        self._from_engine, from_engine_w = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=_engine_entry, args=(to_engine_r, from_engine_w, config),
                                   name="tideserve-engine", daemon=True)
        self.process.start()
        to_engine_r.close()
        from_engine_w.close()
        self.on_stats = on_stats
        self.info: dict = {}
        self.dead = False
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._alive_at: float | None = None  # monotonic time of the last heartbeat (or ready)
        self._busy_s = 0.0  # how long the engine's loop had been on one round at that heartbeat

    async def start(self) -> dict:
        """Wait until the engine has loaded its model; return its info (languages...).

        Raises EngineMismatchError / SpecError / SourceError as the engine's load raised them,
        EngineLoadError for anything else, EngineDiedError if the process exited first."""
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        threading.Thread(target=self._read, name="engine-results", daemon=True).start()
        self.info = await self._ready
        return self.info

    def _read(self) -> None:
        loop = self._loop
        assert loop is not None
        try:
            while True:
                msg = self._from_engine.recv()
                loop.call_soon_threadsafe(self._on_message, msg)
        except (EOFError, OSError):
            loop.call_soon_threadsafe(self._on_exit)

    def _on_message(self, msg: tuple) -> None:
        op = msg[0]
        if op == "stats":
            if self.on_stats is not None:
                self.on_stats(msg[1])
        elif op == "segment":
            _, rid, index, results, compute_s = msg
            p = self._pending.get(rid)
            if p is None:
                return
            p.results[index] = results
            p.compute_s += compute_s
            if p.on_segment is not None:
                p.on_segment(index, results, True)
            if len(p.results) == p.segments and not p.future.done():
                p.future.set_result(None)
        elif op == "partial":
            _, rid, index, results = msg
            p = self._pending.get(rid)
            if p is not None and p.on_segment is not None and index not in p.results:
                p.on_segment(index, results, False)
        elif op == "error":
            _, rid, kind, message = msg
            p = self._pending.get(rid)
            if p is not None and not p.future.done():
                p.future.set_exception(_REQUEST_ERRORS.get(kind, RuntimeError)(message))
        elif op == "alive":
            self._alive_at, self._busy_s = time.monotonic(), msg[1]
        elif op == "ready":
            self._alive_at = time.monotonic()
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(msg[1])
        elif op == "failed":
            _, kind, message = msg
            exc: Exception = _LOAD_ERRORS[kind](message) if kind in _LOAD_ERRORS else EngineLoadError(
                f"{kind}: {message}", kind)
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(exc)

    def _on_exit(self) -> None:
        self.dead = True
        code = self.process.exitcode
        err = EngineDiedError(f"the engine process exited (code {code}); retry on another replica", retry_after_s=1)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(err)
        for p in self._pending.values():
            if not p.future.done():
                p.future.set_exception(err)

    def stalled_s(self) -> float:
        """Seconds the engine has made no progress, as its heartbeats (``engine.HEARTBEAT_S``)
        tell: how long its loop had been on one round at the last heartbeat, plus the time since
        that heartbeat (a stopped or frozen process sends none). 0 before it is ready."""
        if self._alive_at is None:
            return 0.0
        return self._busy_s + (time.monotonic() - self._alive_at)

    def kill(self) -> None:
        """End a stalled engine process at once (SIGKILL also ends a stopped one): its pipe
        closes, so its waiting requests fail with EngineDiedError (503) and ``dead`` is set."""
        if self.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)

    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            self._to_engine.send(msg)

    @property
    def outstanding(self) -> int:
        """Requests sent to the engine and not yet answered."""
        return len(self._pending)

    def new_rid(self) -> int:
        """A fresh request id (for ``worker.prep.prepare_for_engine``, then ``transcribe_handed``)."""
        return next(self._ids)

    def drop(self, rid: int) -> None:
        """Discard the audio a prep process handed to the engine as ``rid`` (a request refused
        or gone before it started). Safe from any thread."""
        if not self.dead:
            try:
                self._send(("drop", rid))
            except (OSError, EOFError, ValueError):
                self.dead = True

    async def transcribe(self, segments: Sequence[tuple[Any, float] | tuple[Any, float, bool | None]],
                         options: RequestOptions,
                         on_segment: OnSegment | None = None,
                         ) -> tuple[list[WindowResult], float]:
        """Decode ``segments`` (``(int16 PCM, offset_s[, silent])`` each, as EngineLoop.submit takes
        them) as one request: the window
        results in audio order and the model seconds the request used. Cancelling the caller
        cancels the request in the engine (queued windows dropped, decoding rows stopped).
        Raises BadInputError / PayloadTooLargeError from the engine, EngineDiedError."""
        rid = next(self._ids)
        return await self._run(rid, len(segments), ("submit", rid, segments, options), on_segment, offload=True)

    async def transcribe_handed(self, rid: int, segments: int, options: RequestOptions,
                                on_segment: OnSegment | None = None,
                                ) -> tuple[list[WindowResult], float]:
        """As ``transcribe``, for audio a prep process already sent to the engine as ``rid``
        (``worker.prep.prepare_for_engine``) in ``segments`` windows."""
        return await self._run(rid, segments, ("start", rid, options), on_segment, offload=False)

    async def _run(self, rid: int, segments: int, msg: tuple,
                   on_segment: OnSegment | None, offload: bool,
                   ) -> tuple[list[WindowResult], float]:
        if self.dead:
            raise EngineDiedError("the engine process has exited; retry on another replica", retry_after_s=1)
        loop = asyncio.get_running_loop()
        pending = _Pending(loop.create_future(), segments, on_segment=on_segment)
        self._pending[rid] = pending
        try:
            try:
                if offload:  # the send copies the PCM into the pipe: off the event loop, it can block briefly
                    await loop.run_in_executor(None, self._send, msg)
                else:  # a few hundred bytes
                    self._send(msg)
            except (OSError, EOFError, ValueError):  # the pipe is gone: the engine died
                self.dead = True
                raise EngineDiedError("the engine process has exited; retry on another replica", retry_after_s=1) from None
            await pending.future
        except asyncio.CancelledError:
            if not self.dead:
                try:
                    self._send(("cancel", rid))
                except (OSError, EOFError, ValueError):
                    self.dead = True
            raise
        finally:
            self._pending.pop(rid, None)
        ordered = [r for k in sorted(pending.results) for r in pending.results[k]]
        return ordered, pending.compute_s

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the engine to stop and wait for it (then kill it)."""
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self._send(("stop",))
            self.process.join(timeout_s)
            if self.process.is_alive() and self.process.pid is not None:  # alive: started, so it has a pid
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.join(1.0)
        if self._handoff_dir is not None:
            shutil.rmtree(self._handoff_dir, ignore_errors=True)
