"""Hold requests until a replica can take them, then hand one out (least outstanding).

``acquire`` takes a free slot at once only when no request is held; otherwise the request joins
the FIFO hold queue (``tideserve.core.HoldQueue``: the queue the simulator uses) and is handed a
replica when every request held before it has been: a new arrival never takes a freed slot
ahead of held requests. A held request waits up to ``hold_timeout_s``; at most ``max_pending``
wait at once (then 503 with Retry-After). Every change of replica state or of outstanding
counts (``notify``, ``release``) releases held requests in order; a periodic re-check covers
readiness changes nobody notified.

Load tracking is the serving core's ``LoadTracker`` (shared with the simulator): outstanding
requests and outstanding work per replica, arrivals, service times and throughput per pool.
Work is counted in audio seconds. The gateway does not know a request's audio duration before
the worker decodes it, so it uses an ESTIMATE (``estimate_audio_s``): the client's
``X-Audio-Seconds`` header when sent; else, for a WAV file sent as the body or as a multipart
upload (its RIFF header within the body's first 4 KB), the duration its header declares (sample
rate, channels and sample size of its ``fmt`` chunk, the size of its ``data`` chunk); else the
body size at 32,000 bytes per second (16 kHz 16-bit mono PCM, the format Whisper resamples to):
compressed audio is underestimated, base64 in JSON overestimated by a third. The worker will report its outstanding work itself; until
then this estimate is the narrow interface (``acquire(audio_s=...)``, ``release(audio_s=...)``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping

from tideserve.core import EWMA_ALPHA, HoldQueue, LoadTracker
from tideserve.errors import CapacityError
from tideserve.gateway.router import ReplicaView, choose_replica
from tideserve.replicas import ReplicaEndpoint, ReplicaSource

__all__ = ["AUDIO_HEADER", "EWMA_ALPHA", "Dispatcher", "estimate_audio_s"]

#: Header a client may send with its audio's duration in seconds (the work estimate).
AUDIO_HEADER = "X-Audio-Seconds"
#: Body bytes per audio second assumed without the header (16 kHz, 16-bit mono PCM).
BYTES_PER_AUDIO_S = 32_000.0


def estimate_audio_s(body: bytes | int, headers: Mapping[str, str] | None = None) -> float:
    """The gateway's estimate of a request's audio seconds (module docstring): ``body`` is the
    request's body (or only its length, then the WAV header cannot be read)."""
    if headers is not None and AUDIO_HEADER in headers:
        try:
            v = float(headers[AUDIO_HEADER])
            if 0 <= v < 1e7:
                return v
        except ValueError:
            pass
    if isinstance(body, bytes | bytearray):
        declared = wav_duration_s(body)
        return declared if declared is not None else len(body) / BYTES_PER_AUDIO_S
    return body / BYTES_PER_AUDIO_S


#: How far into a body a WAV file's RIFF header is looked for (a multipart upload's part headers
#: come first).
WAV_SEARCH_BYTES = 4096


def wav_duration_s(body: bytes) -> float | None:
    """The duration in seconds that a RIFF/WAVE file in ``body`` declares (the file itself, or a
    multipart part: its header within the first ``WAV_SEARCH_BYTES``), from its ``fmt`` and
    ``data`` chunks; a ``data`` size of 0 or 0xFFFFFFFF (a stream that never filled it in), or
    past the body's end, counts the bytes present. None when there is no such header or it is
    not PCM-like (no sample rate, channels or sample size). Reads headers only (no samples)."""
    start = body.find(b"RIFF", 0, WAV_SEARCH_BYTES)
    if start < 0 or body[start + 8: start + 12] != b"WAVE":
        return None
    pos, rate, frame = start + 12, 0, 0
    while pos + 8 <= len(body) and pos < start + WAV_SEARCH_BYTES * 16:
        cid, size = body[pos: pos + 4], int.from_bytes(body[pos + 4: pos + 8], "little")
        if cid == b"fmt " and size >= 16 and pos + 24 <= len(body):
            channels = int.from_bytes(body[pos + 10: pos + 12], "little")
            rate = int.from_bytes(body[pos + 12: pos + 16], "little")
            bits = int.from_bytes(body[pos + 22: pos + 24], "little")
            frame = channels * ((bits + 7) // 8)
        elif cid == b"data":
            if not rate or not frame:
                return None
            present = len(body) - (pos + 8)
            data = present if size in (0, 0xFFFFFFFF) or size > present else size
            return data / (rate * frame)
        pos += 8 + size + (size & 1)
    return None


@dataclass(eq=False)
class _Waiter:
    exclude: frozenset[str]
    audio_s: float
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Dispatcher:
    """Also the gateway's load view for the autoscaler: pending (held), in-flight and
    outstanding counts and work, the last arrival, service rates and throughput per pool."""

    def __init__(self, source: ReplicaSource, max_pending: int, hold_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.max_pending = max_pending
        self.hold_timeout_s = hold_timeout_s
        self.clock = clock
        self.load = LoadTracker(clock)
        self.held: HoldQueue[_Waiter] = HoldQueue(max_pending, hold_timeout_s)
        self.on_hold: Callable[[], None] | None = None

    # -- the load view ---------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self.held)

    @property
    def outstanding(self) -> dict[str, int]:
        return {rid: r.outstanding for rid, r in self.load.replicas.items() if r.outstanding}

    def arrived(self, audio_s: float = 0.0) -> None:
        """A request arrived (resets the autoscaler's idle timer, whatever becomes of it)."""
        self.load.arrived(audio_s)

    def arrived_work(self, audio_s: float) -> None:
        """The estimated work of the request that ``arrived`` announced."""
        self.load.arrived_work(audio_s)

    def ready_replicas(self) -> int:
        """Replicas that take requests now, as the replica source lists them."""
        return sum(e.ready for e in self.source.endpoints())

    def answered(self, latency_s: float | None, slo_s: float, audio_s: float, ready: int | None = None) -> None:
        """A request was answered after ``latency_s`` (None: refused or timed out), having met
        ``ready`` replicas when it arrived, for the autoscaler's SLO term
        (``core.LoadTracker.answered``)."""
        self.load.answered(latency_s, slo_s, audio_s, ready)

    def last_arrival(self) -> float | None:
        return self.load.last_arrival()

    def outstanding_of(self, replica_id: str) -> int:
        return self.load.outstanding_of(replica_id)

    def work_of(self, replica_id: str) -> float:
        return self.load.work_of(replica_id)

    def pending_audio_s(self) -> float:
        return self.held.audio_s()

    def record_service(self, pool: str, seconds: float) -> None:
        """A request finished on ``pool`` after ``seconds`` at the replica."""
        self.load.record_service(pool, seconds)

    def service_rates(self) -> dict[str, float]:
        """Measured requests per second one replica of each pool serves (1 / mean service time)."""
        return self.load.service_rates()

    def throughput_audio_s(self) -> dict[str, float]:
        return self.load.throughput_audio_s()

    def in_flight(self) -> int:
        return self.load.in_flight()

    # -- holding and routing ---------------------------------------------------------------
    def notify(self) -> None:
        """Something changed (replica state, a request finished): release held requests."""
        self._release_held()

    def _try_pick(self, exclude: frozenset[str] = frozenset(), audio_s: float = 0.0) -> ReplicaEndpoint | None:
        eps = {e.id: e for e in self.source.endpoints() if e.id not in exclude}
        rates = self.service_rates()
        views = [
            ReplicaView(e.id, e.ready, self.load.outstanding_of(e.id), e.max_concurrency,
                        self.load.replicas[e.id].last_chosen if e.id in self.load.replicas else 0.0,
                        rates.get(e.pool, 1.0))
            for e in eps.values()
        ]
        rid = choose_replica(views)
        if rid is None:
            return None
        self.load.dispatched(rid, eps[rid].pool, audio_s)
        return eps[rid]

    def reserve_idle(self, exclude: frozenset[str], limit: int) -> list[ReplicaEndpoint]:
        """Up to ``limit`` ready replicas with nothing outstanding (not in ``exclude``), each with a
        slot reserved (``release`` each after; no work counted: the file's estimate stays with the
        replica that received it), the fastest pools first. None while requests are held: a held
        request has the first claim on any free slot. For spreading a long file (``SPREAD_HEADER``)."""
        if limit <= 0 or len(self.held):
            return []
        rates = self.service_rates()
        idle = [e for e in self.source.endpoints()
                if e.ready and e.id not in exclude and e.max_concurrency > 0 and not self.load.outstanding_of(e.id)]
        idle.sort(key=lambda e: (-rates.get(e.pool, 1.0), e.id))
        for e in idle[:limit]:
            self.load.dispatched(e.id, e.pool, 0.0)
        return idle[:limit]

    def _place(self, w: _Waiter) -> bool:
        if w.future.done():
            return True  # gave up (timeout, cancelled): drop it from the queue
        exclude = w.exclude if any(e.id not in w.exclude for e in self.source.endpoints()) else frozenset()
        picked = self._try_pick(exclude, w.audio_s)
        if picked is None:
            return False
        w.future.set_result(picked)
        return True

    def _release_held(self) -> None:
        self.held.release(self._place)

    async def acquire(self, exclude: frozenset[str] = frozenset(), audio_s: float = 0.0) -> ReplicaEndpoint:
        """A replica with a slot reserved for this request; call ``release`` after.

        ``exclude`` names replicas not to use (one that just failed this request), unless
        no other replica exists. ``audio_s``: the request's estimated work. Raises
        CapacityError (503, Retry-After) when the pending queue is full, when every pool has
        failed, or when no slot frees up within ``hold_timeout_s``.
        """
        if exclude and not any(e.id not in exclude for e in self.source.endpoints()):
            exclude = frozenset()
        if not len(self.held):
            picked = self._try_pick(exclude, audio_s)
            if picked is not None:
                return picked
        if not self.source.accepting():
            raise CapacityError(f"no replica can serve this endpoint: {self.source.failure_reason()}", retry_after_s=30)
        if not self.held.may_hold():
            raise CapacityError(
                f"too many requests waiting ({len(self.held)} >= max_pending {self.max_pending}); retry later",
                retry_after_s=1,
            )
        w = _Waiter(exclude, audio_s)
        deadline = self.held.push(w, self.clock(), audio_s)
        if self.on_hold is not None:
            self.on_hold()  # activation: the autoscaler decides now, not at its next tick
        self._release_held()
        handed = False
        try:
            while True:
                if w.future.done():
                    handed = True
                    return w.future.result()
                if not self.source.accepting():
                    raise CapacityError(f"no replica can serve this endpoint: {self.source.failure_reason()}", retry_after_s=30)
                remaining = deadline - self.clock()
                if remaining <= 0:
                    # Retry soon: a replica is probably starting, and a long wait could outlast
                    # scale_to_zero_after_s and let it go again.
                    raise CapacityError(
                        f"no replica could take the request within hold_timeout_s={self.hold_timeout_s:g}", retry_after_s=1
                    )
                try:
                    # Also wake periodically: replica readiness may change without a notify.
                    await asyncio.wait_for(asyncio.shield(w.future), min(remaining, 0.5))
                except TimeoutError:
                    self._release_held()
        finally:
            if not w.future.done():
                w.future.cancel()
                self.held.remove(w)
            elif not handed and not w.future.cancelled():
                # A slot was reserved as this request gave up (cancelled): give it back.
                self.release(w.future.result().id, audio_s, served=False)

    def release(self, replica_id: str, audio_s: float = 0.0, served: bool = True) -> None:
        """The request reserved on ``replica_id`` is done (``served``: its ``audio_s`` counts
        in the pool's throughput); held requests are released in order."""
        self.load.finished(replica_id, audio_s, served=served)
        self._release_held()
