"""Request preparation, run in the prep processes: parse a body, decode its audio, cut windows.

Everything here is Python and FFmpeg work on the CPU that must not share an interpreter lock
with the engine loop or the HTTP front (issue 12): body parsing (JSON, base64, KServe binary
tensors), audio decoding and resampling to 16 kHz int16 PCM, and cutting the audio into <= 30 s
windows at quiet points. The front hands each body to a ``PrepPool`` process and gets back a
``Prepared``: small fields plus the PCM (one copy through a pipe, no per-sample Python work).
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import select
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import numpy as np

from tideserve.errors import CapacityError
from tideserve.protocol import kserve, sagemaker
from tideserve.protocol.types import TranscriptionRequest
from tideserve.worker.audio import SAMPLE_RATE, decode_pcm16
from tideserve.worker.longform import is_digital_silence
from tideserve.worker.windows import split_windows


@dataclass(frozen=True)
class Prepared:
    """A parsed request with its audio decoded: ``request`` (its ``audio`` emptied), the API's
    own parsed form where the response needs it (``extra``: a KServe ``InferRequest``),
    ``pcm`` (int16, 16 kHz mono) and ``cuts``: the windows as ``(start, end)`` sample indices."""

    request: TranscriptionRequest
    pcm: np.ndarray
    cuts: tuple[tuple[int, int], ...]
    extra: Any = None
    #: Per window: digital silence (``worker.longform.is_digital_silence``), judged here so that
    #: the engine process spends no time on it.
    silent: tuple[bool, ...] = ()

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / SAMPLE_RATE

    def segments(self) -> list[tuple[np.ndarray, float, bool | None]]:
        """The windows as ``(pcm slice, offset_s, silent)`` (views, no copy; ``silent`` None when
        not judged)."""
        flags = self.silent or (None,) * len(self.cuts)
        return [(self.pcm[a:b], a / SAMPLE_RATE, f) for (a, b), f in zip(self.cuts, flags, strict=True)]


def prepare_audio(req: TranscriptionRequest, max_audio_s: float | None, extra: Any = None) -> Prepared:
    """Decode ``req.audio`` and cut it into windows. Raises BadInputError / PayloadTooLargeError
    (see ``worker.audio.decode_pcm16``)."""
    pcm = decode_pcm16(req.audio, max_audio_s)
    cuts, silent, start = [], [], 0
    for w in split_windows(pcm, SAMPLE_RATE):
        cuts.append((start, start + len(w.samples)))
        silent.append(is_digital_silence(w.samples))
        start += len(w.samples)
    return Prepared(dataclasses.replace(req, audio=b""), pcm, tuple(cuts), extra, tuple(silent))


def prepare_invocation(body: bytes, content_type: str | None, max_audio_s: float | None) -> Prepared:
    """``POST /invocations`` (SageMaker style: JSON with base64 audio, or the audio file itself
    with an audio content type)."""
    return prepare_audio(sagemaker.parse_invocation(body, content_type), max_audio_s)


def prepare_infer(body: bytes, header_length: str | None, max_audio_s: float | None) -> Prepared:
    """``POST /v2/models/{name}/infer`` (KServe v2, JSON or binary tensors)."""
    parsed = kserve.parse_infer(body, header_length)
    slim = dataclasses.replace(parsed, request=dataclasses.replace(parsed.request, audio=b""))
    return prepare_audio(parsed.request, max_audio_s, extra=slim)


def default_processes(cpu_count: int | None = None) -> int:
    """Prep processes for a machine of ``cpu_count`` cores: a quarter of them, 1 to 8 (decoding
    a request takes milliseconds against the model's tens to hundreds, so few suffice; the rest
    of the cores stay with the engine and the front)."""
    n = cpu_count or os.cpu_count() or 1
    return max(1, min(8, n // 4))


def _warm() -> int:
    return os.getpid()


def _init_process(owner_pid: int) -> None:
    """In each prep process: Ctrl-C goes to the whole process group; the front shuts us down,
    and if it dies without doing so (SIGKILL, the OOM killer) we end too (``exit_with_owner``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_owner(owner_pid)


def exit_with_owner(owner_pid: int, poll_s: float = 1.0) -> threading.Thread:
    """End this process (``os._exit(0)``) as soon as process ``owner_pid`` ends.

    A prep process is a child of multiprocessing's fork server, not of the worker, and holds
    both ends of its own task queue, so it never sees the worker die: without this, every
    SIGKILLed worker left its fork server and prep processes behind. Waits on a pidfd (Linux
    5.3+: readable when the process exits); elsewhere polls ``os.kill(pid, 0)`` every
    ``poll_s`` seconds. Returns the daemon thread that waits."""
    def wait() -> None:
        try:
            fd = os.pidfd_open(owner_pid)
        except ProcessLookupError:
            os._exit(0)
        except (AttributeError, OSError):  # no pidfd on this kernel or platform
            while True:
                try:
                    os.kill(owner_pid, 0)
                except ProcessLookupError:
                    os._exit(0)
                except PermissionError:
                    pass  # alive, owned by another user
                time.sleep(poll_s)
        select.select([fd], [], [])
        os._exit(0)

    t = threading.Thread(target=wait, daemon=True, name="exit-with-owner")
    t.start()
    return t


class PrepPool:
    """``processes`` prep processes (forkserver: started from a clean interpreter that has
    imported this module, never forked from the threaded front).

    ``run(fn, *args)`` runs ``fn`` in one of them. A process that dies (a crash inside FFmpeg,
    the OOM killer) breaks the pool: it is replaced by a new pool and the request is tried once
    more; if that dies too, CapacityError (503 with Retry-After) answers the request."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"prep processes must be >= 1, got {processes}")
        self.processes = processes
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(["tideserve.worker.prep"])
        self._pool = self._new_pool()
        self.replaced = 0

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.processes, mp_context=self._ctx, initializer=_init_process,
                                   initargs=(os.getpid(),))

    def start(self) -> None:
        """Start the processes now (not at the first request)."""
        for _ in range(self.processes):
            self._pool.submit(_warm)

    async def run(self, fn: Callable[..., Prepared], *args: Any) -> Prepared:
        loop = asyncio.get_running_loop()
        for _attempt in range(2):
            pool = self._pool
            try:
                return await loop.run_in_executor(pool, fn, *args)
            except BrokenProcessPool:
                if self._pool is pool:  # the first caller to see it replaces the pool
                    self._pool = self._new_pool()
                    self.replaced += 1
                    pool.shutdown(wait=False, cancel_futures=True)
        raise CapacityError("the audio decoding process died while preparing this request, twice; "
                            "retry, and if it persists send the audio in another format", retry_after_s=1)

    def pids(self) -> list[int]:
        """The prep processes' pids (for operations and tests)."""
        return sorted((getattr(self._pool, "_processes", None) or {}).keys())

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
