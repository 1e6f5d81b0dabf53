"""The engine: one loop that owns the model and schedules windows onto it, in a process of its own.

A worker replica runs three kinds of process (DESIGN.md, "a process per stage"): the HTTP front
(``worker.server``), prep processes that parse bodies and decode audio (``worker.prep``), and
this engine process, which does only scheduling and model work, so the model loop never waits
for the interpreter lock behind request handling (the cause of the served path running at 5%
of the engine on an H200; issue 12). vLLM V1 splits its API server and engine core the same way.

Units of work: a request arrives as *segments* (cuts of its audio at quiet points, each <= 30 s,
int16 PCM). When it decodes with timestamps, the segments of a run of speech up to
``windows.STRETCH_S`` long are joined into a *stretch* (``_stretches``; a longer run's segments
are decoded apart). Each segment or stretch is decoded as a chain of
*parts*: a part is one decode of a window, up to 30 s of the audio from a seek point, at one
temperature. After each decode Whisper's long-form rules (``worker.longform.follow_up``)
decide: decode again at a higher temperature (fallback), continue from the seek point (a new
part: the next 30 s of the stretch from there, as openai/whisper's ``transcribe`` does, or the
rest of the window alone at a stretch's end), go on after the window (a stretch's next 30 s),
or accept. Parts of one segment run one after another; segments, stretches and requests run side
by side. Follow-up parts go to the front of the
queue, so a request that has started finishes before newer ones start; among its own queued
parts, the earliest unfinished segment's goes first, then those whose chains hold the most
windows (``EngineLoop._order_follow_ups``).

Two ways to run a backend, chosen by what it offers:
- continuous (a backend with ``admit``/``run``/``finished``, the torch backend): windows join
  the running decode whenever slots are free (their features and encoder pass run between
  decode chunks) and leave it when they end, so one window that runs to the token limit holds
  only its own slot (in-flight batching, as TensorRT-LLM and vLLM do);
- static (``transcribe_batch`` only, faster-whisper): Triton's dynamic batcher, the pure
  ``worker.batching.cut_batch`` decision, on up to ``instances`` model instances at once (each
  runs one batch in a thread of its own; CTranslate2 releases the interpreter lock while it
  runs). A long file's batches take at most all instances but one and run in the background
  lane, at a lower CPU priority (``batching.next_batch``), so a short request does not wait for
  a long file's batch to end, nor share the cores with it evenly.
In both, which queued parts go next is a round-robin over requests (``batching.round_robin``),
so a long file's windows interleave with short requests instead of running ahead of them.

Messages (pickled tuples over ``multiprocessing`` connections):
front -> engine: ``("submit", rid, segments, options)`` with ``segments`` a list of
``(int16 array, offset_s, silent)`` and ``options`` a ``RequestOptions``; ``("cancel", rid)``; ``("stop",)``.
The audio need not pass through the front: a prep process sends ``("audio", rid, pcm, cuts,
silent)`` straight to the engine (``pcm`` int16, ``cuts`` ``(start, end)`` sample indices per
window, ``silent`` a flag per window) over its own connection to the engine's handoff socket
(``worker.handoff``), and the front then sends ``("start", rid, options)`` to run it or
``("drop", rid)`` to discard it (a request refused after its audio was decoded). The two halves
arrive on different connections in either order; ``EngineLoop.handle`` joins them by ``rid``.
On the H200 the front carried every request's PCM twice (from the prep process, to the engine)
and was the served path's limit at one full core (issue 12).
engine -> front: ``("ready", info)`` or ``("failed", kind, message)`` once at start;
``("segment", rid, index, results, compute_s)`` when a segment's chain is complete;
``("partial", rid, index, results)`` for a request with ``RequestOptions.stream``: a segment's
chain so far (each result final: a chain only grows) each time a window of it is accepted and
the chain goes on, so that a stream's deltas need not wait for a whole stretch;
``("error", rid, kind, message)`` when a request failed; every message after ``ready`` is
preceded by ``("stats", EngineStats)`` when counters moved.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field, fields, replace
from typing import Any
from collections.abc import Callable

import numpy as np

from tideserve.errors import LanguageMismatchError
from tideserve.spec.models import Decoding
from tideserve.worker.backends.base import PreviousText, Resume, WindowResult, WindowTask
from tideserve.worker.cores import lower_thread_priority, usable_cores
from tideserve.worker.language_id import LanguageIdConfig, mismatch_message, other_language
from tideserve.worker.batching import NextBatch, QueuedItem, next_batch, round_robin
from tideserve.worker.longform import (Accept, Split, conditioning_context, decodes_timestamps, follow_up,
                                       is_digital_silence, repeats_tail, resumed_rest_holds, tail_holds_speech)
from tideserve.worker import windows
from tideserve.worker.windows import pause_middle, stretch_starts, windows_of

log = logging.getLogger("tideserve.worker.engine")
SAMPLE_RATE = 16_000
#: Most parts one segment may take (seeks and fallbacks). Each seek moves forward by at least
#: a timestamp step, so this only bounds pathological outputs.
MAX_PARTS_PER_SEGMENT = 32
#: Samples in one decoder window (Whisper's 30 s).
WINDOW = round(windows.WINDOW_S * SAMPLE_RATE)
#: The loop split (``longform.Split``): a part is split at most this many times over its
#: lineage, and only when it holds at least ``MIN_SPLIT_S`` of audio (halves of >= 1/3 each).
MAX_SPLITS = 2
MIN_SPLIT_S = 10.0
#: Decoder steps between two looks at which rows ended (one device sync and one round of host
#: work each). Measured on the H200 with tiny.en, the engine alone at batch 64 on the same 2,000
#: requests: 8 steps gave 6,678 audio-s/s at 56% GPU busy, 16 steps 8,561 at 73% (one machine,
#: bench/results/gpu_engine_sweep_h200.json); on another, 16 steps 7,133 at 66% and 32 steps
#: 7,720 at 78% (gpu_engine_sweep_h200_graphs.json): the host work per round, not the steps a
#: finished row idles, sets the pace. But served through HTTP on that machine, 32 steps gave less
#: than 16 (6,264 against 6,725 audio-s/s at 256 clients, 4,812 against 5,866 at 64:
#: gpu_e2e_h200_chunk32.json, gpu_e2e_h200_encoder_graphs_first.json): each request waits longer for its last rows,
#: so fewer are in flight. A row that ends mid-chunk holds its slot until the chunk ends.
#: A backend with a ``chunk_steps`` attribute (not None) sets the chunk instead: the torch
#: backend's follows its measured step time (``torch_whisper.decode.decode_pace``).
DEFAULT_CHUNK_STEPS = 16
#: Seconds the engine loop encodes at admission again after encoding ahead failed (out of device
#: memory, say) before it tries again; a guess: long enough not to pay a failing pass every round.
AHEAD_RETRY_S = 5.0

#: Seconds between the engine process's heartbeats to its front (``("alive", busy_s)``: how long
#: the loop has been on its current work, 0 while it waits for some).
HEARTBEAT_S = 1.0


def default_instances(cpu_count: int | None = None) -> int:
    """Model instances for a static-batching replica on ``cpu_count`` cores (default: this
    process's, ``worker.cores.usable_cores``): one per core plus the one kept for newcomers, at
    most 9 (measured on 2 cores: README, Accuracy, and bench/fairness.py)."""
    n = cpu_count or usable_cores()
    return max(2, min(9, n + 1))


@dataclass(frozen=True)
class RequestOptions:
    """What a request asks of every window: prompt, language, timestamps, task."""

    prompt: str | None = None
    language: str | None = None
    timestamps: bool = False
    task: str = "transcribe"
    words: bool = False
    #: Send a segment's chain so far as each of its windows is accepted (``("partial", ...)``).
    stream: bool = False


@dataclass
class EngineStats:
    """Counters the engine sends to the front (deltas since the last message). Seconds are
    engine wall time per stage; ``queue_s`` sums each part's wait before it started."""

    windows: int = 0          # parts decoded (Triton's inference count)
    executions: int = 0       # encoder passes (continuous) or batches (static)
    rows_stepped: int = 0     # sum over decode chunks of the rows they ran (mean batch = rows/chunks)
    chunks: int = 0
    fallbacks: int = 0
    seeks: int = 0
    splits: int = 0           # looping windows decoded again as two halves
    quiet_rests: int = 0      # seeks not taken: the window's rest held no speech (longform.tail_holds_speech)
    repeated_rests: int = 0   # rests after a seek that wrote only the end of the text before (longform.repeats_tail)
    resumed_rests: int = 0    # rests decoded over their window's kept encoder output (WindowTask.resume)
    redone_rests: int = 0     # resumed rests not kept, decoded again from their own audio (longform.resumed_rest_holds)
    dropped: int = 0          # parts dropped unexecuted because their request was cancelled
    queue_s: float = 0.0
    features_s: float = 0.0
    encoder_s: float = 0.0
    decode_s: float = 0.0
    detokenize_s: float = 0.0
    queued: int = 0           # parts waiting now (a gauge, not a delta)
    active: int = 0           # rows decoding now (a gauge)

    def take(self) -> EngineStats:
        """A copy of the counters, which are then zeroed (gauges kept)."""
        out = EngineStats(**{f.name: getattr(self, f.name) for f in fields(self)})
        for f in fields(self):
            if f.name not in ("queued", "active"):
                setattr(self, f.name, type(getattr(self, f.name))())
        return out

    def moved(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self) if f.name not in ("queued", "active"))


@dataclass
class _Part:
    rid: int
    segment: int
    samples: np.ndarray
    offset_s: float
    options: RequestOptions
    temperature: float
    enqueued_s: float
    attempts: list[WindowResult] = field(default_factory=list)
    parts_so_far: int = 1
    compute_s: float = 0.0
    #: With ``condition_on_previous_text``: what the request decoded so far (``WindowTask.previous``).
    context: tuple[PreviousText, ...] = ()
    #: Audio of this segment after ``samples`` still to decode, as ``(samples, offset_s,
    #: splits)`` in order (left by loop splits), and how many splits this part's lineage has had.
    rest: tuple[tuple[np.ndarray, float, int], ...] = ()
    splits: int = 0
    identify: bool = False  # identify the spoken language with this decode (its first attempt only)
    after_seek: bool = False  # this part is the rest of a window after a seek
    #: Decode ``samples`` (the whole window) from ``resume.from_s`` over its kept encoder output.
    resume: Resume | None = None
    #: Run in a batch of its own: a batch this part was in failed (``EngineLoop._finish_static``).
    alone: bool = False
    #: The segment's audio after this part's window (int16 PCM, contiguous with it), when the
    #: segment is longer than one window: decoded next, from the seek point, as the windows of
    #: openai/whisper's ``transcribe`` follow one another. Empty otherwise.
    after: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))
    #: Its window's encoder output made before admission (the backend's ``encode_ahead``), or None.
    ahead: Any = field(default=None, repr=False, compare=False)

    def successor(self, samples: np.ndarray, offset_s: float, temperature: float, now: float, **changes: Any) -> _Part:
        """The next part of this segment: ``samples`` from ``offset_s``, queued at ``now``, with
        no attempts yet; other fields as here unless ``changes`` names them."""
        changes.setdefault("after_seek", False)
        changes.setdefault("resume", None)
        changes.setdefault("ahead", None)
        return replace(self, samples=samples, offset_s=offset_s, temperature=temperature, enqueued_s=now,
                       attempts=[], compute_s=0.0, parts_so_far=self.parts_so_far + 1, identify=False, **changes)

    def over(self, audio: np.ndarray, offset_s: float, temperature: float, now: float, **changes: Any) -> _Part:
        """The next part of this segment over ``audio`` (the rest of the segment, from
        ``offset_s``): its first window, the remainder in ``after``."""
        return self.successor(audio[:WINDOW], offset_s, temperature, now, after=audio[WINDOW:], **changes)

    @property
    def windows_left(self) -> int:
        """The windows this part's chain still holds, an estimate: its own and one per 30 s (or
        part of it) of ``after`` (a seek adds one, a quiet end or a loop split's rest changes it)."""
        return 1 + -(-len(self.after) // WINDOW)

    def task(self) -> WindowTask:
        o = self.options
        return WindowTask(self.samples, self.offset_s, o.prompt, o.language, o.timestamps, self.temperature, o.task,
                          o.words, identify_language=self.identify, resume=self.resume, previous=self.context,
                          ahead=self.ahead)

    def fresh_rest(self, from_s: float, temperature: float, now: float, context: tuple[PreviousText, ...]) -> _Part:
        """This window's audio from ``from_s`` (seconds from ``samples``' start) as a part of its
        own, encoded again (the rest after a seek, as openai/whisper's ``transcribe`` decodes it)."""
        start = round(from_s * SAMPLE_RATE)
        return self.successor(self.samples[start:], self.offset_s + start / SAMPLE_RATE, temperature, now,
                              context=context, after_seek=True)


@dataclass
class _Request:
    rid: int
    segments: int
    results: dict[int, list[WindowResult]] = field(default_factory=dict)  # segment -> its chain so far
    done: set[int] = field(default_factory=set)  # segments whose chain is complete (sent)
    compute_s: float = 0.0
    #: With ``condition_on_previous_text``: the segments not queued yet (each waits for the one
    #: before it), and what was decoded since the last prompt reset (``WindowTask.previous``).
    later: collections.deque[_Part] = field(default_factory=collections.deque)
    context: tuple[PreviousText, ...] = ()
    #: The decode that identified the spoken language, until its fields ride on an accepted
    #: result (the identifying decode itself may be split or fall back and not be accepted).
    heard: WindowResult | None = None
    #: Stretches: the first segment's index -> the indices of the segments joined to it
    #: (answered empty when the stretch is complete; its results hold their text).
    joined: dict[int, list[int]] = field(default_factory=dict)


Emit = Callable[[tuple], None]
#: Starts one batch: ``start(run, done, background)`` calls ``run()`` (the backend's execution)
#: now or on another thread (a background-lane thread when ``background``), then
#: ``done(outcome)`` with its return value or the exception it raised.
Starter = Callable[[Callable[[], Any], Callable[[Any], None], bool], None]


def start_inline(run: Callable[[], Any], done: Callable[[Any], None], background: bool = False) -> None:
    """A ``Starter`` that executes on the caller's thread (one model instance)."""
    del background
    try:
        outcome = run()
    except Exception as exc:
        outcome = exc
    done(outcome)


class ThreadStarter:
    """A ``Starter`` over ``instances`` threads for short batches and ``instances`` - 1 for the
    background lane, whose threads run ``background_nice`` lower
    (``worker.cores.lower_thread_priority``); ``close`` ends them."""

    def __init__(self, instances: int, background_nice: int = 0) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=instances, thread_name_prefix="engine-instance")
        self._background = ThreadPoolExecutor(
            max_workers=max(1, instances - 1), thread_name_prefix="engine-background",
            initializer=lower_thread_priority, initargs=(background_nice,))

    def __call__(self, run: Callable[[], Any], done: Callable[[Any], None], background: bool = False) -> None:
        (self._background if background else self._pool).submit(start_inline, run, done)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._background.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Execution:
    """One batch running on a model instance (static backends)."""

    parts: list[_Part]
    background: bool = False  # a long caller's batch, in the background lane (``batching.next_batch``)
    outcome: Any = None  # (results, timings) or the exception, once done


class EngineLoop:
    """Schedules the windows of many requests onto ``backend``; see the module doc.

    ``emit(message)`` sends a message to the front; ``clock()`` gives seconds (monotonic).
    ``submit``/``cancel`` are called by the loop's own thread (from ``handle``); ``run_once``
    does one round of scheduling and model work and returns whether anything was done.
    Static backends: ``instances`` batches may execute at once, each started by ``start``
    (default: on the loop's thread with one instance, else a ``ThreadStarter`` whose background
    lane runs ``background_nice`` lower; a backend with ``background_lane`` is told which lane
    a batch runs in, ``transcribe_batch(tasks, background=True)``); ``wake()`` is
    called from the instance's thread when a batch ends, so the caller's wait for messages
    returns (the results are handled by the next ``run_once`` on the loop's thread).
    Continuous backends: ``chunk_steps`` decoder steps run per round (``steps_per_round``;
    None: the backend's own, else ``DEFAULT_CHUNK_STEPS``); a chunk given here leaves the
    backend's own run-ahead as it is (the torch backend's is paced by its step time).
    ``encode_ahead``: with a continuous backend that has ``encode_ahead`` and ``ahead_ready``,
    the first that many windows of the queue's round-robin are encoded before their admission
    (each round once its chunk is queued, at most ``max_batch_size`` a pass), and windows are
    admitted only once encoded, in the round-robin's order: while rows decode, only those whose
    pass has finished (``ahead_ready``), so that no row's steps wait for an encoder pass; with
    none decoding, at once. 0 (the default): each admission encodes its windows (see
    ``_run_continuous``). When encoding ahead fails, admissions encode their windows for
    ``AHEAD_RETRY_S``.
    """

    def __init__(self, backend: Any, decoding: Decoding, max_batch_size: int, max_queue_delay_s: float,
                 emit: Emit, clock: Callable[[], float] = time.monotonic, chunk_steps: int | None = None,
                 instances: int = 1, start: Starter | None = None, wake: Callable[[], None] = lambda: None,
                 language_id: LanguageIdConfig | None = None, model_name: str = "",
                 background_nice: int = 0, stretch_s: float | None = None, encode_ahead: int = 0) -> None:
        if instances < 1:
            raise ValueError(f"instances {instances} must be >= 1")
        if encode_ahead < 0:
            raise ValueError(f"encode_ahead {encode_ahead} must be >= 0 (windows; 0: off)")
        self.backend = backend
        self.decoding = decoding
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self.emit = emit
        self.clock = clock
        self.chunk_steps = chunk_steps
        self.stretch_s = windows.STRETCH_S if stretch_s is None else stretch_s  # None: the module's, read now
        # Language identification (``worker.language_id``): asked of each request's first speech
        # window when the backend can and the request names no language.
        self.language_id = language_id if getattr(backend, "identifies_language", False) else None
        self.model_name = model_name
        self._languages = frozenset(getattr(backend, "languages", ()))
        self.continuous = all(hasattr(backend, a) for a in ("admit", "run", "finished", "release"))
        self.encode_ahead = encode_ahead if self.continuous and hasattr(backend, "encode_ahead") \
            and hasattr(backend, "ahead_ready") else 0
        self._ahead_retry_at = -math.inf  # encoding ahead failed: admissions encode until then
        self.queue: collections.deque[_Part] = collections.deque()
        self._unordered: set[int] = set()  # requests with a follow-up queued since the last cut
        self.requests: dict[int, _Request] = {}
        self.active: dict[Any, _Part] = {}  # backend handle (slot) -> part
        self.stats = EngineStats()
        # Joining a prep process's ("audio", ...) with the front's ("start"/"drop", ...): the
        # half that came first waits here. ``_dropped`` holds rids whose audio is still on its
        # way but whose request is already gone (the front only drops or cancels a rid whose
        # prep process has sent its audio, so each entry is matched once and removed).
        self._audio: dict[int, list[tuple]] = {}
        self._starts: dict[int, RequestOptions] = {}
        self._dropped: set[int] = set()
        self.instances = 1 if self.continuous else instances
        self._start: Starter = start or (start_inline if self.instances == 1
                                         else ThreadStarter(self.instances, background_nice))
        self._backend_lanes = bool(getattr(backend, "background_lane", False))
        self._wake = wake
        self.executing: list[_Execution] = []  # static batches started and not yet collected
        self._ended: collections.deque[_Execution] = collections.deque()  # appended by instance threads

    # --- messages ------------------------------------------------------------------------

    def handle(self, msg: tuple) -> bool:
        """Apply one message from the front. Returns False for ``stop``."""
        op = msg[0]
        if op == "submit":
            self.submit(msg[1], msg[2], msg[3])
        elif op == "audio":
            self._on_audio(msg[1], windows_of(msg[2], msg[3], msg[4]))
        elif op == "start":
            self._on_start(msg[1], msg[2])
        elif op == "drop":
            if self._audio.pop(msg[1], None) is None:
                self._dropped.add(msg[1])
        elif op == "cancel":
            self.cancel(msg[1])
            if self._starts.pop(msg[1], None) is not None:  # started, its audio not here yet
                self._dropped.add(msg[1])
        elif op == "stop":
            return False
        # "wake": a batch ended on an instance's thread (``wake``); run_once collects it.
        return True

    def _on_audio(self, rid: int, segments: list[tuple]) -> None:
        if rid in self._dropped:
            self._dropped.discard(rid)
        elif rid in self._starts:
            self.submit(rid, segments, self._starts.pop(rid))
        else:
            self._audio[rid] = segments

    def _on_start(self, rid: int, options: RequestOptions) -> None:
        segments = self._audio.pop(rid, None)
        if segments is None:
            self._starts[rid] = options
        else:
            self.submit(rid, segments, options)

    @property
    def waiting_halves(self) -> int:
        """Requests of which only the audio or only the start has arrived (operations, tests)."""
        return len(self._audio) + len(self._starts) + len(self._dropped)

    def submit(self, rid: int, segments: list[tuple], options: RequestOptions) -> None:
        """Queue request ``rid``: ``segments`` of ``(int16 PCM, offset_s)`` or ``(int16 PCM,
        offset_s, silent)``, where ``silent`` (digital silence, judged by the prep process; None:
        judged here) answers that window empty without the model."""
        if not segments:
            self.emit(("error", rid, "BadInputError", "the request has no audio windows"))
            return
        if decodes_timestamps(options.timestamps, len(segments), self.decoding.without_timestamps):
            options = replace(options, timestamps=True)  # json and text show only the text
        now = self.clock()
        req = _Request(rid, len(segments))
        self.requests[rid] = req
        silent = []
        queued = False
        seeks = options.timestamps or self.decoding.without_timestamps is False  # only then can a window seek
        for k, samples, offset, is_silent in _stretches(segments, self.stretch_s if seeks else 0.0, req.joined):
            if is_silent:
                silent.append(k)
            else:
                part = _Part(rid, k, samples[:WINDOW], offset, options, self.decoding.temperatures[0], now,
                             identify=self.language_id is not None and options.language is None and not queued,
                             after=samples[WINDOW:])
                # Conditioning on previous text: one segment at a time, in order.
                if self.decoding.condition_on_previous_text and queued:
                    req.later.append(part)
                else:
                    self.queue.append(part)
                    queued = True
        for k in silent:  # answered without the model
            req.results[k] = [WindowResult(text="", language=options.language or "en", silent=True)]
            req.done.add(k)
            self.emit(("segment", rid, k, req.results[k], 0.0))
        if len(req.done) == req.segments:
            del self.requests[rid]

    def cancel(self, rid: int, client_gone: bool = True) -> None:
        """Forget request ``rid``: its queued parts are dropped (counted as ``dropped`` when
        ``client_gone``), its decoding rows stopped."""
        if self.requests.pop(rid, None) is None:
            return
        before = len(self.queue)
        self.queue = collections.deque(p for p in self.queue if p.rid != rid)
        if client_gone:
            self.stats.dropped += before - len(self.queue)
        handles = [h for h, p in self.active.items() if p.rid == rid]
        for h in handles:
            del self.active[h]
        if handles:
            self.backend.release(handles)

    # --- scheduling ------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not self.queue and not self.active and not self.executing

    def wait_s(self) -> float | None:
        """How long the loop may block for messages before it has work: None = until one
        arrives (or an executing batch ends: ``wake``); 0 = work is ready now."""
        if self.active or self._ended:
            return 0.0
        if not self.queue:
            return None
        if self.continuous:
            return 0.0
        cut = self._next_cut()
        if cut is None:
            return None
        return 0.0 if cut.take else cut.wait_s

    def _queued_items(self) -> list[QueuedItem]:
        """The queue as the batching policy reads it, after ordering the follow-ups (every cut
        reads it here, so the indices it returns are the queue's)."""
        self._order_follow_ups()
        # A part counts the windows it still holds: a stretch's part is up to 3 decodes.
        return [QueuedItem(p.rid, p.enqueued_s, p.windows_left, p.options.stream) for p in self.queue]

    def _next_cut(self) -> NextBatch | None:
        """The static batch to start now (queue indices, and its lane) or how long until one
        may be cut; None when no instance is free or no queued part may take a free one."""
        free = self.instances - len(self.executing)
        if free < 1 or not self.queue:
            return None
        busy = collections.Counter(p.rid for e in self.executing for p in e.parts)
        return next_batch(self._queued_items(), busy, sum(e.background for e in self.executing), free,
                          self.instances, self.max_batch_size, self.max_queue_delay_s, self.clock())

    def _take(self, indices: tuple[int, ...]) -> list[_Part]:
        chosen = set(indices)
        parts = [self.queue[i] for i in indices]  # in the cut's (round-robin) order
        self.queue = collections.deque(p for i, p in enumerate(self.queue) if i not in chosen)
        now = self.clock()
        for p in parts:
            self.stats.queue_s += max(0.0, now - p.enqueued_s)
        return parts

    def run_once(self) -> bool:
        """One round: admit/execute what the policy allows, collect what ended. Returns True
        when model work was done."""
        worked = self._run_continuous() if self.continuous else self._run_static()
        self.stats.queued = len(self.queue)
        self.stats.active = len(self.active) + sum(len(e.parts) for e in self.executing)
        if self.stats.moved():
            self.emit(("stats", self.stats.take()))
        return worked

    def _run_static(self) -> bool:
        """Collect the batches that ended, start batches on the free instances, and collect
        again (with one instance the batch has run inline by then)."""
        worked = self._collect()
        while (cut := self._next_cut()) is not None and cut.take:
            take = next(((i,) for i in cut.take if self.queue[i].alone), cut.take)
            execution = _Execution(self._take(take), background=cut.background)
            self.executing.append(execution)
            lane = {"background": True} if cut.background and self._backend_lanes else {}
            self._start(functools.partial(self.backend.transcribe_batch, [p.task() for p in execution.parts], **lane),
                        functools.partial(self._ended_batch, execution), cut.background)
            worked = True
        return self._collect() or worked

    def close(self) -> None:
        """End the instances' threads (a batch still executing finishes unobserved)."""
        close = getattr(self._start, "close", None)
        if close is not None:
            close()

    def _ended_batch(self, execution: _Execution, outcome: Any) -> None:
        """On the instance's thread: hand the outcome to the loop's thread and wake it."""
        execution.outcome = outcome
        self._ended.append(execution)
        self._wake()

    def _collect(self) -> bool:
        worked = False
        while self._ended:
            execution = self._ended.popleft()
            self.executing.remove(execution)
            self._finish_static(execution.parts, execution.outcome)
            worked = True
        return worked

    def _follow(self, part: _Part) -> None:
        """Queue ``part``, a follow-up of a started request, at the front (so the request's parts
        come before newer requests': a request that has started finishes before newer ones
        start); its request's own parts are ordered before the next cut (``_order_follow_ups``)."""
        self.queue.appendleft(part)
        self._unordered.add(part.rid)

    def _order_follow_ups(self) -> None:
        """Order the queued parts of each request that got a follow-up since the last cut, among
        their own positions in the queue (one pass, so the order between requests stays): first
        the part of the request's earliest segment not yet done (a stream's next delta waits for
        it), then by the windows their chains still hold, most first, ties in audio order. The
        longest chain bounds when a file ends (its critical path): continuations first had left
        a 20-minute file's last stretches to start only after the middles of the others, and
        their chains then ran one after another at its end (README, Accuracy: the order of a
        file's parts)."""
        if not self._unordered:
            return
        rids, self._unordered = self._unordered, set()
        places: dict[int, list[int]] = {}
        for i, p in enumerate(self.queue):
            if p.rid in rids:
                places.setdefault(p.rid, []).append(i)
        places = {rid: where for rid, where in places.items() if len(where) > 1 and rid in self.requests}
        if not places:  # each such request has one part queued (the common case): nothing to order
            return
        queue = list(self.queue)
        for rid, where in places.items():
            req = self.requests[rid]
            first = next((k for k in range(req.segments) if k not in req.done), -1)
            ordered = sorted((queue[i] for i in where), key=lambda p: (p.segment != first, -p.windows_left, p.offset_s))
            for i, p in zip(where, ordered, strict=True):
                queue[i] = p
        self.queue = collections.deque(queue)

    def _finish_static(self, parts: list[_Part], outcome: Any) -> None:
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            results, timings = outcome
            if len(results) != len(parts):
                raise RuntimeError(f"backend returned {len(results)} results for {len(parts)} inputs")
        except Exception as exc:
            if len(parts) > 1:
                # One bad input fails only its own request: the batch's windows go back to the
                # front of the queue, each to run in a batch of its own, scheduled as any batch
                # (instances, lanes, cancellation); one that fails alone fails its request.
                # They keep their time in the queue, so none waits for a batch to fill again.
                for p in reversed(parts):  # in their batch's order, not reordered: each runs alone
                    if p.rid in self.requests:
                        p.alone = True
                        self.queue.appendleft(p)
            else:
                self._fail(parts[0].rid, exc)
            return
        for p in parts:
            p.alone = False
        self.stats.executions += 1
        self.stats.windows += len(parts)
        self.stats.features_s += timings.input_s
        self.stats.encoder_s += timings.infer_s
        self.stats.detokenize_s += timings.output_s
        share = timings.total_s / len(parts)
        for p, r in zip(parts, results, strict=True):
            p.compute_s += share
            self._on_result(p, r)

    def _run_continuous(self) -> bool:
        """One round: admit queued windows into free slots (features and encoder), run a decode
        chunk over every row, collect the rows that ended. On a GPU the backend queues the
        admission and the chunk without waiting for the device and the round waits once (in
        ``finished``). A window admitted here is stepped in this round's chunk: admitting after
        the chunk instead (to overlap the admission's host work with it) left each freed slot
        empty for a chunk, ~1/6 of a typical window's life. With ``encode_ahead`` the windows
        the next admissions would take are encoded once the chunk is queued (``_encode_ahead``;
        on the torch backend's own stream, beside the chunk), and an admission takes only those
        (``_admission_cut``): it is then only the decoder's cache fill."""
        b = self.backend
        worked = False
        free = b.free_slots
        cut = self._admission_cut(min(free, self.max_batch_size)) if self.queue and free > 0 else ()
        if cut:
            parts = self._take(cut)
            try:
                handles, timings = b.admit([p.task() for p in parts])
            except Exception as exc:
                handles, timings = [], None
                for p in parts:
                    try:
                        (h,), t = b.admit([p.task()])
                    except Exception as one:
                        self._fail(p.rid, one)
                        continue
                    self.active[h] = p
                    self._charge([p], t.total_s)
                    self.stats.executions += 1
                log.debug("batched admit failed (%s); admitted one by one", exc)
            else:
                for h, p in zip(handles, parts, strict=True):
                    self.active[h] = p
                self._charge(parts, timings.total_s)
                self.stats.executions += 1
                self.stats.features_s += timings.input_s
                self.stats.encoder_s += timings.infer_s
            for p in parts:  # admitted (its encoder output is in the decoder's cache now) or failed
                p.ahead = None
            self.stats.windows += len(parts)
            worked = True
        if self.active:
            rows = len(self.active)
            t0 = self.clock()
            b.run(self.steps_per_round())
            ahead_s = self._encode_ahead() if self._ahead_on() else 0.0  # queued beside the chunk
            done, detok_s = b.finished()
            elapsed = self.clock() - t0 - ahead_s
            self.stats.chunks += 1
            self.stats.rows_stepped += rows
            self.stats.decode_s += max(0.0, elapsed - detok_s)
            self.stats.detokenize_s += detok_s
            self._charge(list(self.active.values()), elapsed)
            for h, r in done:
                finished = self.active.pop(h, None)
                if finished is not None:
                    self._on_result(finished, r)
            worked = True
        elif self.queue and self._ahead_on():  # nothing decoding: encode now, admit next round
            self._encode_ahead()
            worked = True
        return worked

    def _ahead_on(self) -> bool:
        """Whether windows are encoded ahead now (``encode_ahead``, not within a failure's
        ``AHEAD_RETRY_S``)."""
        return bool(self.encode_ahead) and self.clock() >= self._ahead_retry_at

    def _admission_cut(self, n: int) -> tuple[int, ...]:
        """Up to ``n`` queue indices to admit, in the round-robin's order
        (``batching.round_robin``); encoding ahead, only windows encoded ahead, and while rows
        decode only those whose pass has finished."""
        items = self._queued_items()  # may reorder the queue: indices are read after it
        if not self._ahead_on():
            return round_robin(items, n)
        idle = not self.active
        ready = self.backend.ahead_ready
        order = round_robin(items, len(items))
        return tuple([i for i in order if self.queue[i].ahead is not None and (idle or ready(self.queue[i].ahead))][:n])

    def _encode_ahead(self) -> float:
        """Encode the first ``encode_ahead`` windows of the queue's round-robin not yet encoded
        (at most ``max_batch_size``: one pass); returns the host seconds it took. When the
        backend fails, admissions encode their windows for ``AHEAD_RETRY_S`` (a warning says so)."""
        order = round_robin(self._queued_items(), self.encode_ahead)
        parts = [self.queue[i] for i in order if self.queue[i].ahead is None][: self.max_batch_size]
        if not parts:
            return 0.0
        t0 = self.clock()
        try:
            handles, timings = self.backend.encode_ahead([p.task() for p in parts])
        except Exception as exc:
            self._ahead_retry_at = self.clock() + AHEAD_RETRY_S
            log.warning("encoding %d windows ahead failed (%s: %s); admissions encode their windows for %g s",
                        len(parts), type(exc).__name__, exc, AHEAD_RETRY_S)
            return self.clock() - t0
        for p, h in zip(parts, handles, strict=True):
            p.ahead = h
        self.stats.features_s += timings.input_s
        self.stats.encoder_s += timings.infer_s
        self._charge(parts, timings.total_s)
        return self.clock() - t0

    def steps_per_round(self) -> int:
        """Decoder steps in this round's chunk: ``chunk_steps`` when given, else the backend's
        (its ``chunk_steps``, when it has one now), else ``DEFAULT_CHUNK_STEPS``."""
        return self.chunk_steps or getattr(self.backend, "chunk_steps", None) or DEFAULT_CHUNK_STEPS

    def _charge(self, parts: list[_Part], seconds: float) -> None:
        """Share ``seconds`` of model time equally among ``parts`` (their requests' compute)."""
        if parts:
            share = seconds / len(parts)
            for p in parts:
                p.compute_s += share

    # --- results ---------------------------------------------------------------------------

    def _on_result(self, part: _Part, result: WindowResult) -> None:
        req = self.requests.get(part.rid)
        if req is None:
            return  # cancelled meanwhile
        req.compute_s += part.compute_s
        part.compute_s = 0.0
        if part.identify:
            part.identify = False  # a fallback decode of this window does not identify again
            req.heard = replace(result, encoded=None)
            lid = self.language_id
            if lid is not None and lid.reject and other_language(result.model_language_probability, lid.min_probability,
                                                                 result.detected_language, self._languages):
                self._fail(part.rid, LanguageMismatchError(mismatch_message(
                    result.detected_language or "", result.detected_language_probability or 0.0,
                    result.model_language_probability or 0.0, self.model_name)))
                return
        part.attempts.append(result)
        can_split = part.splits < MAX_SPLITS and len(part.samples) >= MIN_SPLIT_S * SAMPLE_RATE
        action = follow_up(part.attempts, self.decoding, can_split, was_split=part.splits > 0)
        now, t0 = self.clock(), self.decoding.temperatures[0]
        sought = req.results[part.segment][-1] if part.after_seek and req.results.get(part.segment) else None
        if part.resume is not None and not (isinstance(action, Accept) and resumed_rest_holds(
                part.samples, action.result, self.decoding, SAMPLE_RATE, sought)):
            # A resumed rest that fails the quality thresholds, loops, or leaves speech
            # untranscribed is decoded again from its own audio (where a fallback or a split then
            # works as for any part).
            self.stats.redone_rests += 1
            self._follow(part.fresh_rest(part.resume.from_s, t0, now, part.context))
            return
        if isinstance(action, Split):
            n = len(part.samples)
            cut = n // 3 + pause_middle(part.samples[n // 3: 2 * n // 3], SAMPLE_RATE)
            self.stats.splits += 1
            self._follow(part.successor(
                part.samples[:cut], part.offset_s, t0, now, splits=part.splits + 1,
                rest=((part.samples[cut:], part.offset_s + cut / SAMPLE_RATE, part.splits + 1), *part.rest)))
            return
        if not isinstance(action, Accept):
            part.attempts = [replace(a, encoded=None) for a in part.attempts]  # only an accepted decode keeps one
            self.stats.fallbacks += 1
            part.temperature = action.temperature
            part.enqueued_s = now
            self._follow(part)
            return
        chain = req.results.setdefault(part.segment, [])
        accepted = replace(action.result, encoded=None)  # the encoder output stays in this process
        if req.heard is not None:  # the language heard rides on the first result accepted after it
            h, req.heard = req.heard, None
            lid = self.language_id
            accepted = replace(accepted, detected_language=h.detected_language,
                               detected_language_probability=h.detected_language_probability,
                               model_language_probability=h.model_language_probability,
                               language_mismatch=lid is not None and other_language(
                                   h.model_language_probability, lid.min_probability, h.detected_language,
                                   self._languages))
        rest_start = part.resume.from_s if part.resume is not None else 0.0
        if part.after_seek and chain and repeats_tail(chain[-1], accepted, rest_start):
            self.stats.repeated_rests += 1
            accepted = replace(accepted, text="", segments=[], loop_free_text=None, tokens=())
        if self.decoding.condition_on_previous_text:
            req.context = conditioning_context(req.context, accepted, part.attempts[-1].temperature)
        chain.append(replace(accepted, tokens=()))  # the tokens stay in the engine: the front has no use for them
        seek = action.seek_s
        quiet_end = False  # the stretch's end, from the seek point, holds no speech: it is done
        if seek is not None and part.parts_so_far < MAX_PARTS_PER_SEGMENT:
            start = round(seek * SAMPLE_RATE)
            if 0 < start < len(part.samples):
                # Inside a stretch the next window starts at the seek point and runs on into it
                # (transcribe); a rest decoded alone (a window's own, or a stretch's last window)
                # only when it holds speech (the quiet tail).
                joined = len(part.after) > 0 and not part.rest
                audio = np.concatenate([part.samples, part.after]) if joined else part.samples
                if len(audio) - start > WINDOW or tail_holds_speech(audio, seek, SAMPLE_RATE):
                    self.stats.seeks += 1
                    encoded = action.result.encoded
                    if joined:  # a fresh window from the seek point
                        self._go_on(part, chain, part.over(audio[start:], part.offset_s + start / SAMPLE_RATE, t0,
                                                           now, context=req.context, after_seek=True))
                    elif encoded is None:
                        self._go_on(part, chain, part.fresh_rest(seek, t0, now, req.context))
                    else:
                        self.stats.resumed_rests += 1
                        self._go_on(part, chain, part.successor(part.samples, part.offset_s, t0, now,
                                                                context=req.context, after_seek=True,
                                                                resume=Resume(seek, encoded)))
                    return
                self.stats.quiet_rests += 1
                quiet_end = joined
        if part.rest:  # the second half of a loop split follows the first
            (samples, offset, splits), *rest = part.rest
            self._go_on(part, chain, part.successor(samples, offset, t0, now, context=req.context, rest=tuple(rest),
                                                    splits=splits))
            return
        if len(part.after) and not quiet_end:  # the next window of a segment longer than one
            self._go_on(part, chain, part.over(part.after, part.offset_s + len(part.samples) / SAMPLE_RATE, t0,
                                               now, context=req.context))
            return
        self.emit(("segment", part.rid, part.segment, chain, req.compute_s))
        req.compute_s = 0.0
        req.done.add(part.segment)
        for k in req.joined.get(part.segment, ()):  # their audio was decoded in this stretch
            req.results[k] = [WindowResult(text="", language=chain[-1].language)]
            req.done.add(k)
            self.emit(("segment", part.rid, k, req.results[k], 0.0))
        if req.later:  # conditioning: the next segment starts from this one's text
            nxt = req.later.popleft()
            nxt.context, nxt.enqueued_s = req.context, now
            self._follow(nxt)
        # Complete only when every segment's chain is: a segment whose first part was accepted
        # may still have a seek part queued or executing (in a static batch it is in neither
        # the queue nor ``active``).
        if len(req.done) == req.segments:
            del self.requests[part.rid]

    def _go_on(self, part: _Part, chain: list[WindowResult], nxt: _Part) -> None:
        """Queue ``nxt``, the next part of ``part``'s segment, whose ``chain`` of accepted results
        goes on; a streamed request is sent the chain so far (``("partial", ...)``)."""
        if part.options.stream:
            self.emit(("partial", part.rid, part.segment, list(chain)))
        self._follow(nxt)

    def _fail(self, rid: int, exc: BaseException) -> None:
        if rid in self.requests:
            self.cancel(rid, client_gone=False)
            self.emit(("error", rid, type(exc).__name__, str(exc)))


def _stretches(segments: list[tuple], max_s: float, joined: dict[int, list[int]]
               ) -> list[tuple[int, np.ndarray, float, bool]]:
    """``(index, samples, offset_s, silent)`` per stretch to decode: ``segments`` (``(int16 PCM,
    offset_s[, silent])``, as ``EngineLoop.submit`` takes them) joined by ``windows.stretch_starts``
    (a run of up to ``max_s`` seconds; ``max_s`` 0: none joined). ``joined`` gets, per stretch of several, its first index -> the
    indices joined to it."""
    silent = [bool(flag[0]) if flag and flag[0] is not None else is_digital_silence(samples)
              for samples, _, *flag in segments]
    starts = [round(offset * SAMPLE_RATE) for _, offset, *_ in segments]
    cuts = [(a, a + len(seg[0])) for a, seg in zip(starts, segments, strict=True)]
    out: list[tuple[int, np.ndarray, float, bool]] = []
    for k, begins in enumerate(stretch_starts(cuts, silent, max_s, SAMPLE_RATE)):
        samples, offset = segments[k][0], segments[k][1]
        if begins:
            out.append((k, samples, offset, silent[k]))
        else:
            k0, prev, prev_offset, _ = out[-1]
            out[-1] = (k0, np.concatenate([prev, samples]), prev_offset, False)
            joined.setdefault(k0, []).append(k)
    return out


# --- the engine process ---------------------------------------------------------------------


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine process needs to load its model (picklable)."""

    backend: str
    model_dir: str
    target: Any  # spec.models.Target
    decoding: Decoding
    max_batch_size: int
    max_queue_delay_s: float
    cpu_threads: int = 0
    #: Decoder steps per round; None: the backend's (``chunk_steps``), else DEFAULT_CHUNK_STEPS
    #: (the backend's run-ahead is its own either way).
    chunk_steps: int | None = None
    #: Model instances executing batches at once (static backends; ``batching.instances``).
    instances: int = 1
    #: ``(AF_UNIX path, authkey)`` of the socket on which prep processes hand over decoded audio
    #: (``worker.handoff``); None: audio comes only with ``submit`` from the front.
    handoff: tuple[str, bytes] | None = None
    #: The language-ID model and policy (``model.language_id``); None: none.
    language_id: LanguageIdConfig | None = None
    #: How much lower the background lane runs (``batching.background_nice``; 0: not lowered).
    background_nice: int = 0
    #: ``model.kv_cache_dtype``: ``fp8`` keeps the torch backend's cross-attention keys and values in FP8.
    kv_cache_dtype: str = "auto"
    #: ``model.cross_attention``: ``absorbed`` reads one FP8 copy of the encoder's output (torch backend).
    cross_attention: str = "kv"
    #: ``batching.encode_ahead``: queued windows encoded while the rows decode (torch backend; 0: off).
    encode_ahead: int = 0
    model_name: str = ""  # the endpoint's model name (in error messages)


def engine_main(inbox: Any, outbox: Any, config: EngineConfig) -> None:
    """Entry point of the engine process: bind the handoff socket (when configured), load the
    backend, say ``ready`` (or ``failed``), then serve messages until ``stop`` or the front goes
    away. ``inbox``/``outbox``: the two ends of ``multiprocessing`` pipes (``recv``/``send``)."""
    from tideserve.worker.backends import backend_class
    from tideserve.worker.handoff import HandoffListener

    send_lock = threading.Lock()
    messages: queue.SimpleQueue = queue.SimpleQueue()

    def emit(msg: tuple) -> None:
        with send_lock:
            outbox.send(msg)

    handoff: HandoffListener | None = None
    try:
        if config.handoff is not None:
            handoff = HandoffListener(config.handoff[0], config.handoff[1], messages.put)
        backend = backend_class(config.backend)(
            config.model_dir, config.target, config.decoding, cpu_threads=config.cpu_threads,
            max_batch_size=config.max_batch_size, instances=config.instances, language_id=config.language_id,
            background_nice=config.background_nice, **({"cross_fp8": True} if config.kv_cache_dtype == "fp8" else {}),
            **({"cross_absorbed": True} if config.cross_attention == "absorbed" else {}),
            **({"overlap_encoder": True} if config.encode_ahead else {}))
    except BaseException as exc:
        emit(("failed", type(exc).__name__, str(exc) or traceback.format_exc(limit=3)))
        if handoff is not None:
            handoff.close()
        return
    emit(("ready", {"languages": sorted(backend.languages),
                    "continuous": all(hasattr(backend, a) for a in ("admit", "run", "finished", "release"))}))
    loop = EngineLoop(backend, config.decoding, config.max_batch_size, config.max_queue_delay_s, emit,
                      chunk_steps=config.chunk_steps, instances=config.instances, language_id=config.language_id,
                      model_name=config.model_name, background_nice=config.background_nice,
                      encode_ahead=config.encode_ahead, wake=lambda: messages.put(("wake",)))

    def receive() -> None:
        # recv() blocks in a syscall without the interpreter lock; unpickling the int16 PCM is a copy.
        try:
            while True:
                msg = inbox.recv()
                messages.put(msg)
                if msg[0] == "stop":
                    return
        except (EOFError, OSError):
            messages.put(("stop",))

    threading.Thread(target=receive, name="engine-inbox", daemon=True).start()
    busy_since: list[float | None] = [None]  # when the loop started the work it is on; None: waiting

    def heartbeat() -> None:
        # The front takes the replica down when these stop coming or report one round running
        # for local config's engine_stall_s (EngineClient.stalled_s).
        while True:
            time.sleep(HEARTBEAT_S)
            since = busy_since[0]
            try:
                emit(("alive", 0.0 if since is None else time.monotonic() - since))
            except (OSError, ValueError):
                return

    threading.Thread(target=heartbeat, name="engine-heartbeat", daemon=True).start()
    running = True
    while running:
        busy_since[0] = None
        timeout = loop.wait_s()
        try:
            msg = messages.get(timeout=timeout) if timeout != 0.0 else messages.get_nowait()
        except queue.Empty:
            msg = None
        busy_since[0] = time.monotonic()
        while msg is not None:
            if not loop.handle(msg):
                running = False
                break
            try:
                msg = messages.get_nowait()
            except queue.Empty:
                msg = None
        if running:
            try:
                loop.run_once()
            except Exception:
                log.exception("engine loop failed")
                for rid in list(loop.requests):
                    loop._fail(rid, RuntimeError("the engine failed; see the worker log"))
    loop.close()
    if handoff is not None:
        handoff.close()
