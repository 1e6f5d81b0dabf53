"""Request preparation, run in the prep processes: parse a body, decode its audio, cut windows.

Everything here is Python and FFmpeg work on the CPU that must not share an interpreter lock
with the engine loop or the HTTP front (issue 12): body parsing (JSON, base64, KServe binary
tensors), audio decoding and resampling to 16 kHz int16 PCM, and cutting the audio into <= 30 s
windows at quiet points. The front hands each body to a ``PrepPool`` process; when the pool
knows the engine's handoff socket (``worker.handoff``), the prep process sends
the PCM straight to the engine under the request's id (``prepare_for_engine``) and the front
gets back a ``Prepared`` of small fields only, so the PCM never passes through the front (on
the H200 carrying it there twice made the front the served path's limit; issue 12). Without a
handoff socket the ``Prepared`` carries the PCM (one copy through a pipe, no per-sample Python
work).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import os
import select
import signal
import threading
import time
import weakref
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import AuthenticationError
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import numpy as np

from tideserve.errors import BadInputError, CapacityError, ReplicaNotReadyError
from tideserve.protocol import kserve, sagemaker
from tideserve.protocol.types import TranscriptionRequest
from tideserve.worker import handoff
from tideserve.worker.cores import usable_cores
from tideserve.worker.audio import SAMPLE_RATE, decode_pcm16, wav_file
from tideserve.worker.longform import is_digital_silence
from tideserve.worker import windows
from tideserve.worker.windows import WINDOW_S, decoded_alike, stretch_starts, window_cuts, windows_of

log = logging.getLogger("tideserve.worker.prep")


@dataclass(frozen=True)
class RemotePart:
    """A later part of a spread file (``spread``): its first and end sample in the file, and its
    audio as a 16 kHz mono 16-bit WAV file (what ``protocol.internal.PART_PATH`` takes)."""

    start: int
    end: int
    wav: bytes
    #: This part holds the file's first window that is not digital silence: the language is
    #: identified there (``model.language_id``), as in one piece.
    identify: bool = False
    #: The part's windows, ``(start, end)`` sample indices from the part's start: the file's own,
    #: so that its helper decodes the windows of the file as one piece (it does not cut again).
    cuts: tuple[tuple[int, int], ...] = ()

    @property
    def offset_s(self) -> float:
        return self.start / SAMPLE_RATE


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
    #: Set when the PCM was sent to the engine under this request id (``prepare_for_engine``):
    #: then ``pcm`` is empty and the front starts (or drops) the request by this id.
    engine_rid: int | None = None
    #: The later parts of a spread file, to be transcribed elsewhere (``spread``); ``pcm``,
    #: ``cuts`` and ``silent`` are then the first part's.
    remote: tuple[RemotePart, ...] = ()
    #: The whole file's length in samples (the windows may leave out quiet at its end); None:
    #: the end of the last window (of the last part when spread).
    samples: int | None = None

    @property
    def duration_s(self) -> float:
        """The whole file's duration in seconds (spread or not)."""
        if self.samples is not None:
            return self.samples / SAMPLE_RATE
        if self.remote:
            return self.remote[-1].end / SAMPLE_RATE
        return (self.cuts[-1][1] if self.cuts else len(self.pcm)) / SAMPLE_RATE

    def segments(self) -> list[tuple[np.ndarray, float, bool | None]]:
        """The windows as ``(pcm slice, offset_s, silent)`` (views, no copy; ``silent`` None when
        not judged). Raises ValueError when the PCM went to the engine (``engine_rid``)."""
        if self.engine_rid is not None:
            raise ValueError(f"the audio of this request was handed to the engine as request {self.engine_rid}")
        return windows_of(self.pcm, self.cuts, self.silent)


def prepare_audio(req: TranscriptionRequest, max_audio_s: float | None, extra: Any = None,
                  cuts: tuple[tuple[int, int], ...] | None = None) -> Prepared:
    """Decode ``req.audio`` and cut it into windows (``worker.windows.window_cuts``: long quiet
    runs left out), or into ``cuts`` (``(start, end)`` sample indices, in order: a part of a
    spread file comes with the windows its file was cut into). Raises BadInputError (also for
    ``cuts`` past the audio or longer than 30 s) / PayloadTooLargeError (see
    ``worker.audio.decode_pcm16``)."""
    pcm = decode_pcm16(req.audio, max_audio_s)
    if cuts is None:
        cuts = tuple(window_cuts(pcm, SAMPLE_RATE))
    elif cuts and cuts[-1][1] > len(pcm):
        raise BadInputError(f"the windows given end at sample {cuts[-1][1]}, past the audio's {len(pcm)} samples; "
                            "send the audio they were cut from")
    elif any(b - a > WINDOW_S * SAMPLE_RATE for a, b in cuts):
        raise BadInputError(f"a window given is longer than Whisper's {WINDOW_S:g} s; cut the audio into windows of "
                            f"at most {int(WINDOW_S * SAMPLE_RATE)} samples")
    elif len(cuts) > 1 + len(pcm) // SAMPLE_RATE:
        # window_cuts never gives more: its windows are 22 s or longer but the last of a stretch
        # of sound, and the stretches are 1.2 s apart or more (SKIP_QUIET_S less two QUIET_PAD_S).
        raise BadInputError(f"{len(cuts)} windows given for {len(pcm) / SAMPLE_RATE:.1f} s of audio; at most one per "
                            "second of audio (and one more), as the file was cut")
    silent = tuple(is_digital_silence(pcm[a:b]) for a, b in cuts)
    return Prepared(dataclasses.replace(req, audio=b""), pcm, tuple(cuts), extra, silent, samples=len(pcm))


def prepare_invocation(body: bytes, content_type: str | None, max_audio_s: float | None) -> Prepared:
    """``POST /invocations`` (SageMaker style: JSON with base64 audio, or the audio file itself
    with an audio content type)."""
    return prepare_audio(sagemaker.parse_invocation(body, content_type), max_audio_s)


def prepare_infer(body: bytes, header_length: str | None, max_audio_s: float | None) -> Prepared:
    """``POST /v2/models/{name}/infer`` (KServe v2, JSON or binary tensors)."""
    parsed = kserve.parse_infer(body, header_length)
    slim = dataclasses.replace(parsed, request=dataclasses.replace(parsed.request, audio=b""))
    return prepare_audio(parsed.request, max_audio_s, extra=slim)


def spread(prepared: Prepared, parts: int, min_part_s: float, stretch_s: float | None = None) -> Prepared:
    """``prepared`` cut into at most ``parts`` parts of whole windows (so at pauses, where the
    windows were cut), each about the same audio to decode and at least ``min_part_s`` of it
    (the windows' lengths; quiet left out of them does not count): the first stays in
    ``prepared`` (its ``pcm``, ``cuts``, ``silent``), the others go to ``remote`` as WAV files. A
    file under two parts' length, or of one window, is returned as it is.

    The parts' boundaries are the window ends nearest to the even split where a stretch begins,
    both the part and the rest of the file hold at least half of ``min_part_s``, and each, taken
    alone, begins the same stretches as in the whole file (``windows.decoded_alike``: a piece of
    two or more windows of a run decoded window by window, 75 s long or less, would be joined; a
    file of one stretch is not spread, nor one run of 75-150 s). Each later part goes with its
    windows (``RemotePart.cuts``), so its helper decodes the same windows in the same stretches,
    and so writes the same text, as in one piece. A request without timestamps, whose windows the
    engine decodes apart, is cut by the same rule: its parts are only less even, and it too is not
    spread when it is one run of 75-150 s. A silent window begins a stretch, so a part may hold
    only silence (answered without the model). ``stretch_s``: the stretches' length (None:
    ``windows.STRETCH_S``; 0: any window end)."""
    n = len(prepared.cuts)
    ends = list(itertools.accumulate(b - a for a, b in prepared.cuts))  # audio to decode up to each window's end
    total = ends[-1] if ends else 0
    k = min(parts, int(total / SAMPLE_RATE // min_part_s)) if min_part_s > 0 else parts
    if k < 2 or n < 2 or prepared.remote:
        return prepared
    max_s = windows.STRETCH_S if stretch_s is None else stretch_s
    begins = stretch_starts(prepared.cuts, prepared.silent, max_s, SAMPLE_RATE)

    def alike(first: int, end: int) -> bool:  # windows first..end-1 as a part of their own
        return decoded_alike(prepared.cuts, prepared.silent, max_s, first, end, begins, SAMPLE_RATE)

    candidates = [w for w in range(n - 1) if begins[w + 1]]  # a part may end before a stretch begins
    last: list[int] = []  # index of each part's last window
    for i in range(1, k):
        first = last[-1] + 1 if last else 0
        before = ends[first - 1] if first else 0  # audio to decode before this part
        for w in sorted(candidates, key=lambda w: abs(ends[w] - i * total / k)):
            if w < first:
                break  # the nearest end is not after the last part's: one part fewer
            # The part and the rest of the file (which later cuts divide the same way) each hold
            # at least half of min_part_s (no sliver of a part where the nearest ends do not fit)
            # and decode their windows as the whole file does.
            if min(ends[w] - before, total - ends[w]) >= min_part_s * SAMPLE_RATE / 2 and alike(first, w + 1) and \
                    alike(w + 1, n):
                last.append(w)
                break
    last.append(n - 1)
    if len(last) < 2:
        return prepared
    first_end = last[0] + 1
    sound = next((k for k, s in enumerate(prepared.silent) if not s), 0)  # the first window not silent
    remote = tuple(_part(prepared, a + 1, b + 1, identify=a < sound <= b) for a, b in itertools.pairwise(last))
    return dataclasses.replace(prepared, pcm=prepared.pcm[: prepared.cuts[last[0]][1]], cuts=prepared.cuts[:first_end],
                               silent=prepared.silent[:first_end], remote=remote)


def _part(prepared: Prepared, first: int, end: int, identify: bool) -> RemotePart:
    """The part of ``prepared`` of its windows ``first`` to ``end`` (exclusive)."""
    start, stop = prepared.cuts[first][0], prepared.cuts[end - 1][1]
    return RemotePart(start, stop, wav_file(prepared.pcm[start:stop]), identify,
                      tuple((a - start, b - start) for a, b in prepared.cuts[first:end]))


def prepare_spread(parts: int, min_part_s: float, fn: Callable[..., Prepared], *args: Any) -> Prepared:
    """``spread(fn(*args), parts, min_part_s)``: a prep function (picklable) for ``PrepPool``."""
    return spread(fn(*args), parts, min_part_s)


#: In a prep process: the engine's handoff socket ``(path, authkey)`` (set by the pool's
#: initializer) and this process's connection to it (opened at first use).
_handoff: tuple[str, bytes] | None = None
_engine_conn: Any = None
_NO_PCM = np.zeros(0, np.int16)


def prepare_for_engine(rid: int, fn: Callable[..., Prepared], *args: Any) -> Prepared:
    """In a prep process: ``fn(*args)``, then send its PCM, cuts and silence flags to the engine
    as ``("audio", rid, pcm, cuts, silent)``; return the ``Prepared`` without its PCM
    (``engine_rid`` = ``rid``). Raises what ``fn`` raises; CapacityError (503) when the engine's
    socket cannot be reached (the engine died: the replica is restarting)."""
    global _engine_conn
    prepared = fn(*args)
    if _handoff is None:
        raise RuntimeError("this prep process has no engine handoff socket (PrepPool(handoff=...))")
    try:
        if _engine_conn is None:
            _engine_conn = handoff.connect(_handoff[0], _handoff[1])
        _engine_conn.send(("audio", rid, prepared.pcm, prepared.cuts, prepared.silent))
    except (OSError, EOFError, AuthenticationError) as exc:
        _engine_conn = None
        raise ReplicaNotReadyError(f"the engine process cannot be reached ({exc}); retry on another replica",
                                   retry_after_s=1) from None
    return dataclasses.replace(prepared, pcm=_NO_PCM, engine_rid=rid)


class PrepProcessDied(CapacityError):
    """A prep process died while it held the request (the pool was replaced)."""


def default_processes(cpu_count: int | None = None, gpu: bool = False) -> int:
    """Prep processes for a replica of ``cpu_count`` cores (default: ``worker.cores.usable_cores``).

    CPU replica: a quarter of the cores, 1 to 8 (decoding a request takes milliseconds against the
    model's tens to hundreds, and the model needs the cores). GPU replica: three quarters, 1 to 16:
    the engine process needs one core and the front one, and at GPU speed parsing and decoding
    bodies is the limit. Measured on the H200 machine (16 cores, tiny.en, 256 clients, base64 JSON
    bodies; ``bench/gpu_e2e.py --prep-processes N``): 4 processes served 6,902 audio-s/s, 8 served
    7,525, 12 served 7,694 (bench/results/gpu_e2e_h200_prep.json)."""
    n = cpu_count or usable_cores()
    if gpu:
        return max(1, min(16, n * 3 // 4))
    return max(1, min(8, n // 4))


#: Seconds each of ``PrepPool.start``'s tasks holds its process. ``ProcessPoolExecutor`` (with a
#: fork server) spawns a process for a task only when no process is idle, so a first task that
#: ended before the next was submitted left the pool one process short (found in CI: one prep
#: process of two after ``start``, under load). Held this long, every task of ``start`` finds the
#: processes before it busy. Start-up only: the engine's model load takes longer.
WARM_HOLD_S = 1.0


def _warm(hold_s: float = 0.0) -> int:
    time.sleep(hold_s)
    return os.getpid()


#: Seconds between a prep process's heartbeats (``PrepPool``'s stall watch).
HEARTBEAT_S = 0.5
_beats: Any = None  # this process's pool's shared [heartbeat, busy since] pairs (monotonic s)
_slot = -1          # this process's pair in it


def _init_process(owner_pid: int, handoff: tuple[str, bytes] | None = None, beats: Any = None,
                  slots: Any = None) -> None:
    """In each prep process: Ctrl-C goes to the whole process group; the front shuts us down,
    and if it dies without doing so (SIGKILL, the OOM killer) we end too (``exit_with_owner``).
    ``handoff``: the engine's socket for ``prepare_for_engine``. ``beats``/``slots``: the
    pool's shared heartbeat array and slot counter; a daemon thread writes this process's
    heartbeat every ``HEARTBEAT_S`` (a stopped process, or one hung holding the GIL, stops it)."""
    global _handoff, _beats, _slot
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _handoff = handoff
    exit_with_owner(owner_pid)
    if beats is not None and slots is not None:
        with slots.get_lock():
            _slot, slots.value = slots.value, slots.value + 1
        _beats = beats
        def beat() -> None:
            while True:
                beats[2 * _slot] = time.monotonic()
                time.sleep(HEARTBEAT_S)
        beats[2 * _slot] = time.monotonic()
        threading.Thread(target=beat, daemon=True, name="prep-heartbeat").start()


def _held(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a prep process, its start written to the pool's array (``PrepPool``'s
    stall watch counts a call from when a process takes it, not from when it was queued)."""
    if _beats is not None:
        _beats[2 * _slot + 1] = time.monotonic()
    try:
        return fn(*args)
    finally:
        if _beats is not None:
            _beats[2 * _slot + 1] = 0.0


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


def _settle_orphan(future: Any, orphaned: Callable[[Prepared], None]) -> None:
    if not future.cancelled() and future.exception() is None:
        orphaned(future.result())


class PrepPool:
    """``processes`` prep processes (forkserver: started from a clean interpreter that has
    imported this module, never forked from the threaded front).

    ``run(fn, *args)`` runs ``fn`` in one of them. A process that dies (a crash inside FFmpeg,
    the OOM killer) breaks the pool: it is replaced by a new pool and the request is tried once
    more; if that dies too, CapacityError (503 with Retry-After) answers the request.
    ``stall_s`` (local config's ``prep_stall_s``; None: no watch): a process whose heartbeat
    (every ``HEARTBEAT_S``) is older than that (stopped, hung holding the GIL), or that has held
    one call that long since it took it (hung in native code; time queued does not count), is
    taken for dead, as is one started that long ago without a first heartbeat: a watch thread
    kills the pool's processes (which process holds which call is not known), and the calls they
    held are tried once more on a new pool. ``handoff``: the engine's socket ``(path,
    authkey)``; then ``prepare_for_engine`` can run here. Raises ValueError for ``processes`` < 1
    or ``stall_s`` under four heartbeats."""

    def __init__(self, processes: int, handoff: tuple[str, bytes] | None = None, stall_s: float | None = None) -> None:
        if processes < 1:
            raise ValueError(f"prep processes must be >= 1, got {processes}")
        if stall_s is not None and stall_s < 4 * HEARTBEAT_S:
            raise ValueError(f"prep stall_s must be >= {4 * HEARTBEAT_S:g} seconds (four heartbeats), got {stall_s}")
        self.processes = processes
        self.handoff = handoff
        self.stall_s = stall_s
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(["tideserve.worker.prep"])
        # the pools the watch ended (weakly held: an id() could be reused by a later pool)
        self._stalled: weakref.WeakSet[ProcessPoolExecutor] = weakref.WeakSet()
        self._pool = self._new_pool()
        self.replaced = 0
        self._closed = threading.Event()
        if stall_s is not None:
            threading.Thread(target=self._watch, daemon=True, name="prep-stall-watch").start()

    def _new_pool(self) -> ProcessPoolExecutor:
        beats = self._ctx.RawArray("d", 2 * self.processes)  # [heartbeat, busy since] a process
        slots = self._ctx.Value("i", 0)
        pool = ProcessPoolExecutor(max_workers=self.processes, mp_context=self._ctx, initializer=_init_process,
                                   initargs=(os.getpid(), self.handoff, beats, slots))
        self._beats, self._slots = beats, slots
        self._unbeating_since: float | None = None
        return pool

    def stalled(self, now: float | None = None) -> str | None:
        """Why the current pool's processes count as dead (see the class doc), or None. Called by
        the watch thread (it keeps when a started process was first seen without a heartbeat)."""
        if self.stall_s is None:
            return None
        now = time.monotonic() if now is None else now
        beats = self._beats
        # a process started but not yet beating (stopped before its initializer ran)
        if len(getattr(self._pool, "_processes", None) or {}) > self._slots.value:
            self._unbeating_since = self._unbeating_since or now
            if now - self._unbeating_since > self.stall_s:
                return f"a prep process has not started for {now - self._unbeating_since:.0f} s (stopped or hung)"
        else:
            self._unbeating_since = None
        for i in range(self.processes):
            beat, busy = beats[2 * i], beats[2 * i + 1]
            if beat and now - beat > self.stall_s:
                return f"a prep process sent no heartbeat for {now - beat:.0f} s (stopped or hung)"
            if busy and now - busy > self.stall_s:
                return f"a prep process has held one request for {now - busy:.0f} s (hung)"
        return None

    def _watch(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            pool = self._pool
            why = self.stalled()
            if why is None or pool in self._stalled or pool is not self._pool:
                continue
            self._stalled.add(pool)
            log.error("%s, past local config prep_stall_s=%g: the prep processes are ended and replaced",
                      why, self.stall_s)
            for pid in list((getattr(pool, "_processes", None) or {}).keys()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def start(self) -> None:
        """Start the processes now (not at the first request)."""
        for _ in range(self.processes):
            self._pool.submit(_warm, WARM_HOLD_S)

    async def run(self, fn: Callable[..., Prepared], *args: Any) -> Prepared:
        """``fn(*args)`` in a prep process, tried a second time if the process dies. Raises what
        ``fn`` raises; CapacityError when the process died twice."""
        for attempt in range(2):
            try:
                return await self.run_once(fn, *args)
            except PrepProcessDied:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def run_once(self, fn: Callable[..., Prepared], *args: Any,
                       orphaned: Callable[[Prepared], None] | None = None) -> Prepared:
        """``fn(*args)`` in a prep process, once. If the caller is cancelled while it runs and
        it then succeeds, ``orphaned(result)`` is called (from another thread) so that what it
        handed on can be released. Raises what ``fn`` raises; PrepProcessDied (503) when the
        process died or was taken for dead (``stall_s``; the pool is replaced)."""
        pool = self._pool
        try:
            future = pool.submit(_held, fn, *args)
        except BrokenProcessPool:
            future = None
        if future is not None:
            wrapped = asyncio.wrap_future(future)
            try:
                # shielded: a caller's cancellation leaves the call to run (or to fail with its
                # pool); cancelling a queued call can stop Python 3.11's executor from failing the
                # calls queued after it when its processes die (its manager thread raises
                # InvalidStateError on the cancelled one), which then wait forever
                return await asyncio.shield(wrapped)
            except asyncio.CancelledError:
                wrapped.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no warning
                if orphaned is not None:
                    future.add_done_callback(lambda f: _settle_orphan(f, orphaned))
                raise
            except BrokenProcessPool:
                pass
        if self._pool is pool:  # the first caller to see it replaces the pool
            self._pool = self._new_pool()
            self.replaced += 1
            # not cancel_futures: a broken pool fails its queued calls with BrokenProcessPool,
            # which their callers retry; a cancellation would read as the client going away
            pool.shutdown(wait=False)
        if pool in self._stalled:
            raise PrepProcessDied(f"the audio decoding process stopped making progress on this request (local config "
                                  f"prep_stall_s={self.stall_s:g}) and was ended; retry", retry_after_s=1)
        raise PrepProcessDied("the audio decoding process died while preparing this request; retry, and if it "
                              "persists send the audio in another format", retry_after_s=1)

    def pids(self) -> list[int]:
        """The prep processes' pids (for operations and tests)."""
        return sorted((getattr(self._pool, "_processes", None) or {}).keys())

    def close(self) -> None:
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
