"""The serving core shared by the live gateway/runtime and the simulator.

One definition of what both sides keep about replicas and requests, with time always an
argument or an injected clock (never read here), so that what the simulator proves about a
policy holds for the running system:

- ``ReplicaState``: the states a replica goes through (an enum; its values are the strings the
  runtime's status page and metrics already show);
- ``ReplicaRecord``: one replica as the core tracks it (state, when it was wanted and became
  ready, outstanding requests and outstanding work in audio seconds, when last chosen);
- ``LoadTracker``: load tracking: arrivals (last arrival, a histogram of inter-arrival times for
  the keep-alive, the arrival rate of work), an hour of answers per 5 s bin for the SLO term
  (late ones, with the replicas ready then), outstanding requests and work per replica, each pool's measured service time and its
  throughput in audio seconds per busy second (the service rate at the batch sizes reached),
  and each pool's measured cold start;
- ``HoldQueue``: requests held for capacity, released first in, first out, each with a deadline;
- ``plan_apply``: applying an autoscaling decision to a set of replica records: which replicas
  go at once (not started yet), which drain, how many to add per pool.

Pure Python: no asyncio, no I/O; the gateway's dispatcher wraps ``HoldQueue`` around futures,
the simulator around request ids.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar
from collections.abc import Callable, Iterable, Mapping, Sequence

#: Weight of the newest sample in the per-request service-time moving average (about the last
#: 10 requests); shared by the gateway and the simulator.
EWMA_ALPHA = 0.2

#: Time constant (s) of the decayed sums behind the measured throughput and the arrival rate.
RATE_TAU_S = 60.0

#: Upper edges (s) of the inter-arrival-time histogram: 1 s bins to 10 s, then 10 s bins to
#: 2 min, then 1 min bins to 4 h (Shahrad et al. ATC 2020 use 1 min bins over 4 h; the finer
#: head resolves the short gaps of a busy endpoint). Gaps beyond the last edge count as "out of
#: bounds" (the paper's OOB).
IAT_EDGES_S: tuple[float, ...] = tuple(
    [float(s) for s in range(1, 11)] + [float(s) for s in range(20, 121, 10)] + [60.0 * m for m in range(3, 241)])

#: The answer history behind the autoscaler's SLO term (``autoscaler.policy.slo_floor``):
#: answers and late answers per ``ARRIVAL_BIN_S`` bin, kept for ``ARRIVAL_HISTORY_S`` (an hour:
#: long enough to see a trace's bursts recur, short enough to follow a day's peaks and troughs;
#: Shahrad et al. keep 4 h of inter-arrival times for the keep-alive, which changes more slowly).
ARRIVAL_BIN_S = 5.0
ARRIVAL_HISTORY_S = 3600.0

#: Requests longer than this (one Whisper window, s of audio) are left out of the SLO term's
#: answers (``LoadTracker.answered``): their own length, not a lack of capacity, sets their latency.
SLO_TERM_MAX_AUDIO_S = 30.0


class ReplicaState(str, enum.Enum):  # noqa: UP042  StrEnum would change str()/format() of a member (value, not ReplicaState.NAME)
    """A replica's state. ``WAITING``: wanted, no machine yet (cluster/simulator);
    ``STARTING``: placed, loading; ``READY``: takes requests; ``LEAVING``: takes requests, but its
    machine is being reclaimed (a spot interruption notice): not counted as capacity, so a
    replacement is asked for, and it drains once that is ready (make before break);
    ``DRAINING``: finishes its work, takes no new; ``RESTARTING``: crashed, restarts after a
    back-off (live runtime); ``STOPPED``: gone."""

    WAITING = "waiting"
    STARTING = "starting"
    READY = "ready"
    LEAVING = "leaving"
    DRAINING = "draining"
    RESTARTING = "restarting"
    STOPPED = "stopped"

    @property
    def counts_as_capacity(self) -> bool:
        """True for replicas the autoscaler counts (wanted, starting or ready; not draining)."""
        return self in (ReplicaState.WAITING, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.RESTARTING)

    @property
    def serves(self) -> bool:
        """True for replicas that take new requests (ready or leaving)."""
        return self in (ReplicaState.READY, ReplicaState.LEAVING)

    @property
    def not_ready_yet(self) -> bool:
        return self in (ReplicaState.WAITING, ReplicaState.STARTING, ReplicaState.RESTARTING)


#: The states of replicas the autoscaler counts as (present or coming) capacity.
CAPACITY_STATES = frozenset(s for s in ReplicaState if s.counts_as_capacity)


@dataclass
class ReplicaRecord:
    """One replica as the core tracks it; times on the owner's clock (s)."""

    id: str
    pool: str
    state: ReplicaState = ReplicaState.STARTING
    wanted_at: float = 0.0
    ready_at: float | None = None
    outstanding: int = 0
    outstanding_audio_s: float = 0.0
    last_chosen: float = 0.0


# -- load tracking ------------------------------------------------------------------------


@dataclass
class _Decayed:
    """A sum that decays with time constant ``tau``: value(t) = sum of x_i exp(-(t - t_i)/tau)."""

    tau: float = RATE_TAU_S
    value: float = 0.0
    at: float = 0.0

    def add(self, x: float, now: float) -> None:
        self.value = self.get(now) + x
        self.at = max(self.at, now)

    def get(self, now: float) -> float:
        return self.value * math.exp(-max(0.0, now - self.at) / self.tau)


class LoadTracker:
    """Load tracking for one endpoint, on the clock ``clock`` (injected: ``time.monotonic`` live,
    the virtual time in the simulator).

    Work is counted in audio seconds. Live, the gateway does not know a request's duration
    before the worker decodes it; it passes an estimate (``tideserve.gateway.dispatch`` explains
    which); the simulator passes the trace's duration."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.replicas: dict[str, ReplicaRecord] = {}
        self._last_arrival: float | None = None
        self.iat_counts: list[int] = [0] * (len(IAT_EDGES_S) + 1)  # last bin: out of bounds
        self._arrived_work = _Decayed()
        self._service_s: dict[str, float] = {}
        self._done_work: dict[str, _Decayed] = {}
        self._busy: dict[str, _Decayed] = {}
        self._busy_since: dict[str, float] = {}
        self._cold_start_s: dict[str, float] = {}
        self._recent_cold: dict[str, deque] = {}
        self._answers: deque[tuple[int, dict[int, list[int]]]] = deque()  # (bin, {ready: [answered, late]}), oldest first

    # replicas ---------------------------------------------------------------------------
    def record(self, replica_id: str, pool: str, state: ReplicaState = ReplicaState.STARTING) -> ReplicaRecord:
        """The record of ``replica_id`` (created, wanted now, if new)."""
        r = self.replicas.get(replica_id)
        if r is None:
            r = self.replicas[replica_id] = ReplicaRecord(replica_id, pool, state, wanted_at=self.clock())
        return r

    def set_state(self, replica_id: str, pool: str, state: ReplicaState) -> None:
        """A replica changed state; becoming ready records its cold start (wanted -> ready)."""
        r = self.record(replica_id, pool, state)
        if state == ReplicaState.READY and r.ready_at is None:
            r.ready_at = self.clock()
            if r.state.not_ready_yet:  # seen starting: a cold start (not one found ready)
                self.observe_cold_start(pool, r.ready_at - r.wanted_at)
        r.state = state
        if state == ReplicaState.STOPPED:
            self.replicas.pop(replica_id, None)
            self._busy_since.pop(replica_id, None)

    def observe_cold_start(self, pool: str, seconds: float) -> None:
        """A replica of ``pool`` took ``seconds`` from wanted to ready; the pool's cold start is
        the largest of its last 5 (a cautious estimate: an early replica is worth more than a
        cheap one)."""
        q = self._recent_cold.setdefault(pool, deque(maxlen=5))
        q.append(max(0.0, seconds))
        self._cold_start_s[pool] = max(q)

    def cold_start_s(self) -> dict[str, float]:
        return dict(self._cold_start_s)

    # arrivals ---------------------------------------------------------------------------
    def arrived(self, audio_s: float = 0.0) -> None:
        """A request arrived (whatever becomes of it): the idle timer restarts, its gap since the
        previous arrival goes into the inter-arrival histogram, its work into the arrival rate."""
        now = self.clock()
        if self._last_arrival is not None:
            gap = now - self._last_arrival
            self.iat_counts[bisect.bisect_left(IAT_EDGES_S, gap)] += 1
        self._last_arrival = now
        self._arrived_work.add(audio_s, now)

    def arrived_work(self, audio_s: float) -> None:
        """The work of a request counted at ``arrived`` with none (known only later, e.g.
        once the gateway has read its body)."""
        now = self.clock()
        self._arrived_work.add(audio_s, now)

    def last_arrival(self) -> float | None:
        return self._last_arrival

    # answers ----------------------------------------------------------------------------
    def ready_count(self) -> int:
        """Replicas ready now (their records' state)."""
        return sum(r.state == ReplicaState.READY for r in self.replicas.values())

    def answered(self, latency_s: float | None, slo_s: float, audio_s: float = 0.0, ready: int | None = None) -> None:
        """A request was answered ``latency_s`` after it arrived (None: refused, or timed out,
        a miss), against the latency objective ``slo_s``. Counted for the autoscaler's SLO term
        (``autoscaler.policy.slo_floor``) in ``ARRIVAL_BIN_S`` bins over ``ARRIVAL_HISTORY_S``,
        with ``ready``: the replicas ready when it arrived (the capacity it met; default: now).
        A request of more than ``SLO_TERM_MAX_AUDIO_S`` of audio is not counted."""
        if audio_s > SLO_TERM_MAX_AUDIO_S:
            return
        now = self.clock()
        k = int(now // ARRIVAL_BIN_S)
        if ready is None:
            ready = self.ready_count()
        late = int(latency_s is None or latency_s > slo_s)
        if not self._answers or self._answers[-1][0] != k:
            self._answers.append((k, {}))
        counts = self._answers[-1][1].setdefault(ready, [0, 0])
        counts[0] += 1
        counts[1] += late
        horizon = ARRIVAL_HISTORY_S / ARRIVAL_BIN_S
        while self._answers and self._answers[0][0] <= k - horizon:
            self._answers.popleft()

    def answer_history(self) -> tuple[tuple[int, int, int, int], ...]:
        """``(bin, ready replicas, answered, late)`` per ``ARRIVAL_BIN_S`` bin of the answers and
        count of ready replicas at their arrivals, over the ``ARRIVAL_HISTORY_S`` before the last answer, oldest
        first. Pruned at answers only (a reader drops what is older than its own horizon)."""
        return tuple((k, r, n, m) for k, by_ready in self._answers for r, (n, m) in sorted(by_ready.items()))

    def mark_active(self) -> None:
        """The service was already serving now (a replay cut out of a running one, as the
        simulator's warm start assumes): the idle timer starts now, as if a request had just
        arrived; nothing is counted (no inter-arrival gap, no work)."""
        self._last_arrival = self.clock()

    def arrival_rate_audio_s(self) -> tuple[float, float]:
        """``(rate, at)``: audio seconds arriving per second over about the ``RATE_TAU_S``
        before ``at``, the time of the last arrival. A reader decays it to its own ``now``
        (x exp(-(now - at) / RATE_TAU_S)); kept undecayed here so that a snapshot of an
        unchanged load is the same snapshot."""
        return self._arrived_work.value / RATE_TAU_S, self._arrived_work.at

    # requests on replicas ---------------------------------------------------------------
    def _busy_update(self, r: ReplicaRecord, now: float) -> None:
        since = self._busy_since.pop(r.id, None)
        if since is not None:
            self._busy.setdefault(r.pool, _Decayed()).add(now - since, now)
        if r.outstanding > 0:
            self._busy_since[r.id] = now

    def dispatched(self, replica_id: str, pool: str, audio_s: float = 0.0) -> None:
        now = self.clock()
        r = self.record(replica_id, pool, ReplicaState.READY)
        self._busy_update(r, now)
        r.outstanding += 1
        r.outstanding_audio_s += audio_s
        r.last_chosen = now
        self._busy_update(r, now)

    def finished(self, replica_id: str, audio_s: float = 0.0, service_s: float | None = None,
                 served: bool = True) -> None:
        """A request left ``replica_id``; when ``served``, after ``service_s`` at the replica and
        ``audio_s`` of audio transcribed (counted in the pool's throughput)."""
        now = self.clock()
        r = self.replicas.get(replica_id)
        if r is None:
            return
        self._busy_update(r, now)
        r.outstanding = max(0, r.outstanding - 1)
        r.outstanding_audio_s = max(0.0, r.outstanding_audio_s - audio_s)
        if r.outstanding == 0:
            r.outstanding_audio_s = 0.0
        self._busy_update(r, now)
        if served:
            self._done_work.setdefault(r.pool, _Decayed()).add(audio_s, now)
            if service_s is not None:
                self.record_service(r.pool, service_s)

    def record_service(self, pool: str, seconds: float) -> None:
        """A request was served on ``pool`` in ``seconds`` at the replica (moving average)."""
        old = self._service_s.get(pool)
        self._service_s[pool] = seconds if old is None else (1 - EWMA_ALPHA) * old + EWMA_ALPHA * seconds

    def outstanding_of(self, replica_id: str) -> int:
        r = self.replicas.get(replica_id)
        return r.outstanding if r else 0

    def work_of(self, replica_id: str) -> float:
        r = self.replicas.get(replica_id)
        return r.outstanding_audio_s if r else 0.0

    def in_flight(self) -> int:
        return sum(r.outstanding for r in self.replicas.values())

    def service_rates(self) -> dict[str, float]:
        """Measured requests per second one replica of each pool serves (1 / mean service time)."""
        return {p: 1.0 / s for p, s in self._service_s.items() if s > 0}

    def throughput_audio_s(self) -> dict[str, float]:
        """Per pool, audio seconds transcribed per second a replica was busy (had work), over
        about the last ``RATE_TAU_S`` of completed busy time, as of the last change: the service
        rate at the batch sizes actually reached."""
        out = {}
        for pool, done in self._done_work.items():
            busy = self._busy.get(pool)
            if busy is not None and busy.value > 1e-9 and done.value > 0:
                out[pool] = done.value * math.exp(-max(0.0, busy.at - done.at) / done.tau) / busy.value
        return out

    def iat_histogram(self) -> tuple[int, ...]:
        return tuple(self.iat_counts)


# -- holding ------------------------------------------------------------------------------

T = TypeVar("T")


def may_hold(pending: int, max_pending: int) -> bool:
    """True when one more request may wait: ``pending`` (already waiting) < ``max_pending``."""
    return pending < max_pending


def hold_deadline(held_at: float, hold_timeout_s: float) -> float:
    """When a request held since ``held_at`` gives up (same clock and unit, s)."""
    return held_at + hold_timeout_s


@dataclass
class Held(Generic[T]):
    item: T
    held_at: float
    deadline: float
    audio_s: float = 0.0


class HoldQueue(Generic[T]):
    """Requests waiting for capacity, first in first out, each with a deadline
    (``held_at + hold_timeout_s``); at most ``max_pending`` at once (``gateway.holding``)."""

    def __init__(self, max_pending: int, hold_timeout_s: float) -> None:
        self.max_pending = max_pending
        self.hold_timeout_s = hold_timeout_s
        self._q: deque[Held[T]] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self):
        return iter(self._q)

    def may_hold(self) -> bool:
        return may_hold(len(self._q), self.max_pending)

    def push(self, item: T, now: float, audio_s: float = 0.0) -> float:
        """Hold ``item`` from ``now``; returns its deadline. Call ``may_hold`` first."""
        h = Held(item, now, hold_deadline(now, self.hold_timeout_s), audio_s)
        self._q.append(h)
        return h.deadline

    def remove(self, item: T) -> bool:
        for h in self._q:
            if h.item is item or h.item == item:
                self._q.remove(h)
                return True
        return False

    def audio_s(self) -> float:
        return sum(h.audio_s for h in self._q)

    def release(self, place: Callable[[T], bool]) -> list[T]:
        """Hand out held requests in arrival order: ``place(item)`` tries to give the head a
        replica; the first that cannot be placed stops the release (no request overtakes an
        older one). Returns the items placed."""
        placed = []
        while self._q:
            if not place(self._q[0].item):
                break
            placed.append(self._q.popleft().item)
        return placed

    def expire(self, now: float) -> list[T]:
        """Remove and return the items whose deadline has passed."""
        gone = [h for h in self._q if h.deadline <= now]
        for h in gone:
            self._q.remove(h)
        return [h.item for h in gone]


# -- applying a decision --------------------------------------------------------------------


@dataclass(frozen=True)
class ApplyPlan:
    """What applying a decision means for a set of replicas: ``stop`` (not serving yet: stop at
    once), ``drain`` (serving: finish the work, take no more), ``add`` per pool."""

    stop: tuple[str, ...]
    drain: tuple[str, ...]
    add: Mapping[str, int] = field(default_factory=dict)


def plan_apply(replicas: Iterable[tuple[str, str, ReplicaState]], desired: Mapping[str, int],
               drain: Sequence[str]) -> ApplyPlan:
    """Apply a decision to replicas given as ``(id, pool, state)``: the named replicas that do
    not serve yet stop at once, ready ones drain; then each pool gets replicas added until its
    count of capacity states (``CAPACITY_STATES``, minus those going) reaches ``desired``."""
    reps = list(replicas)
    named = set(drain)
    stop = tuple(rid for rid, _, st in reps if rid in named and st.not_ready_yet)
    drn = tuple(rid for rid, _, st in reps if rid in named and st == ReplicaState.READY)
    going = set(stop) | set(drn)
    add = {}
    for pool, n in desired.items():
        have = sum(1 for rid, p, st in reps if p == pool and st.counts_as_capacity and rid not in going)
        if n > have:
            add[pool] = n - have
    return ApplyPlan(stop, drn, add)
