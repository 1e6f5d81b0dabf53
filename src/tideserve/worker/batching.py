"""The dynamic batcher's decision, pure: when to cut a batch and which queued items go in it.

Policy (Triton's dynamic batcher, ``max_queue_delay_microseconds``): a batch is cut as soon as
``max_batch_size`` items are queued, or once the oldest queued item has waited
``max_queue_delay_s``, whichever comes first. The batch is filled round-robin over the callers
with queued items, in order of arrival (one item of each caller per round), so a caller with many
items (the windows of a long file) does not hold back a short one queued behind it.

A replica may run several model instances at once (Triton's ``instance_group`` count; the
faster-whisper backend's CTranslate2 workers), each executing one batch (``next_batch``). Queued
items fall in two classes: a *short* caller's items queued and executing fit in one batch (a
request of a few windows, a long file's last rests); a *long* caller is any other (a 20-minute
file's windows). A batch holds one class only, short first, except that the last free instance
goes to long callers waiting while no background batch executes, so a long file always progresses. Long
batches take at most all instances but one, and run in the *background lane* (a lower CPU priority, where the backend
offers one: ``worker.cores.lower_thread_priority``), so a short request arriving while a long file
is transcribed starts at once and gets the cores first instead of sharing them with the long
file's 30 s windows (issue 13, fairness: a short clip went from 0.42 s to 11.5 s behind one
instance's batch of 8 windows, and to 1.5-2.2x its idle time beside two background-free
instances, bench/results/fairness_runs.txt).

No clock and no I/O: ``now`` is an argument, so the worker's engine loop and the simulator
(``tideserve.sim``) make the same decision from the same queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping, Sequence


#: A streamed long caller's queued items are divided over the lane's free instances in this many
#: rounds of batches (``next_batch``), so that its first windows, and its first delta, come back
#: after about half its time: a streamed 7-minute file decoded window by window
#: (``worker.windows.STRETCH_S``), 16 windows, ran as one batch of 8 on each of two one-thread
#: lane workers and sent its first delta at 0.81-0.88 of the whole answer's time; in batches of 4,
#: at 0.34-0.40. A request not streamed is divided in one round: side by side on the 20-minute file,
#: two rounds were slower in 4 of 5 rounds, by up to 8% (README, Accuracy, "Runs").
LANE_ROUNDS = 2


@dataclass(frozen=True)
class QueuedItem:
    """One queued item as the decision sees it: its ``caller`` (items of one request share it)
    and when it was queued, ``enqueued_s``, on the same clock as ``now``; ``windows``: the 30 s
    windows it stands for (a stretch's part, decoded one window after another, more than one),
    which ``short_callers`` counts; ``streamed``: its caller streams its text."""

    caller: int
    enqueued_s: float
    windows: int = 1
    streamed: bool = False  # its caller streams its text (``LANE_ROUNDS``)


@dataclass(frozen=True)
class BatchCut:
    """``take``: indices into the queue of the items to run now, in batch order (empty: wait).
    ``wait_s``: when ``take`` is empty, seconds until the oldest item's delay runs out (then ask
    again, or sooner if an item arrives); 0 when a batch is cut or the queue is empty."""

    take: tuple[int, ...]
    wait_s: float = 0.0


def round_robin(queue: Sequence[QueuedItem], max_batch_size: int) -> tuple[int, ...]:
    """Up to ``max_batch_size`` indices of ``queue``: one item of each caller per round, callers
    in order of their first queued item, each caller's items in queue order."""
    by_caller: dict[int, list[int]] = {}
    for i, item in enumerate(queue):
        by_caller.setdefault(item.caller, []).append(i)
    queues = list(by_caller.values())
    batch: list[int] = []
    depth = 0
    while len(batch) < max_batch_size and len(batch) < len(queue):
        for q in queues:
            if depth < len(q):
                batch.append(q[depth])
                if len(batch) == max_batch_size:
                    break
        depth += 1
    return tuple(batch)


def cut_batch(queue: Sequence[QueuedItem], max_batch_size: int, max_queue_delay_s: float, now: float) -> BatchCut:
    """The batch to run at ``now`` from ``queue`` (live items, oldest first), or how long to wait.

    Raises ValueError when ``max_batch_size`` < 1 or ``max_queue_delay_s`` < 0.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size {max_batch_size} must be >= 1")
    if max_queue_delay_s < 0:
        raise ValueError(f"max_queue_delay_s {max_queue_delay_s} must be >= 0")
    if not queue:
        return BatchCut(())
    oldest = min(item.enqueued_s for item in queue)
    remaining = oldest + max_queue_delay_s - now
    if len(queue) < max_batch_size and remaining > 0:
        return BatchCut((), remaining)
    return BatchCut(round_robin(queue, max_batch_size))


@dataclass(frozen=True)
class NextBatch:
    """``next_batch``'s answer: ``take``, indices into the queue of the items to start now, in
    batch order (empty: none yet, ask again in ``wait_s`` seconds or when an item arrives);
    ``background``: the batch is a long caller's, for the background lane."""

    take: tuple[int, ...]
    wait_s: float = 0.0
    background: bool = False


def short_callers(queue: Sequence[QueuedItem], executing: Mapping[int, int], max_batch_size: int) -> set[int]:
    """Callers whose windows queued (``QueuedItem.windows``) and items executing (``executing``:
    caller -> items executing) number at most ``max_batch_size`` (a request one batch could
    hold); the others are long callers. Counting the executing items too keeps a short request's
    leftover windows (those its first batch had no room for) short."""
    counts: dict[int, int] = {}
    for item in queue:
        counts[item.caller] = counts.get(item.caller, 0) + item.windows
    return {c for c, n in counts.items() if n + executing.get(c, 0) <= max_batch_size}


def next_batch(queue: Sequence[QueuedItem], executing: Mapping[int, int], background_executing: int,
               free_instances: int, instances: int, max_batch_size: int, max_queue_delay_s: float,
               now: float) -> NextBatch | None:
    """The batch to start on a free model instance at ``now`` (module doc), or None when nothing
    queued may start before an executing batch ends.

    ``queue``: live items, oldest first; ``executing``: caller -> its items executing on some
    instance; ``background_executing``: long batches executing; ``free_instances`` of
    ``instances`` are idle. With one instance there are no classes: ``cut_batch`` over the whole
    queue, never background. Otherwise short callers' items are cut first (``cut_batch`` over
    them alone), on any free instance but the last one while long callers wait and no
    background batch executes (so a long file always progresses); then, while fewer than
    ``instances`` - 1 long batches execute, the long callers' items, as a background batch of at
    most their count divided over the lane's free instances (so a file whose parts fit one batch
    still runs on as many instances as the lane may take, each of whose workers has its share of
    the cores: ``worker.cores.lane_threads``), and over ``LANE_ROUNDS`` when one of them is
    streamed. When neither may be cut yet, the shorter wait.

    Raises ValueError when ``instances`` < 1, ``free_instances`` is not in 1..``instances`` or
    ``background_executing`` is not in 0..``instances`` - ``free_instances``, and as ``cut_batch``.
    """
    if instances < 1:
        raise ValueError(f"instances {instances} must be >= 1")
    if not 1 <= free_instances <= instances:
        raise ValueError(f"free_instances {free_instances} must be in 1..{instances}")
    if not 0 <= background_executing <= instances - free_instances:
        raise ValueError(f"background_executing {background_executing} must be in 0..{instances - free_instances}")
    if instances == 1:
        cut = cut_batch(queue, max_batch_size, max_queue_delay_s, now)
        return NextBatch(cut.take, cut.wait_s) if queue else None
    short = short_callers(queue, executing, max_batch_size)
    lanes = {False: [i for i, item in enumerate(queue) if item.caller in short],
             True: [i for i, item in enumerate(queue) if item.caller not in short]}
    long_starved = bool(lanes[True]) and background_executing == 0 and free_instances == 1
    waits: list[float] = []
    for background in (False, True):
        idx = lanes[background]
        if not idx or (not background and long_starved) or (background and background_executing >= instances - 1):
            continue
        size = max_batch_size
        if background:  # the long callers' items divided over the lane's free instances (and rounds)
            rounds = LANE_ROUNDS if any(queue[i].streamed for i in idx) else 1
            lanes_free = min(free_instances, instances - 1 - background_executing)
            size = min(max_batch_size, -(-len(idx) // (rounds * lanes_free)))
        cut = cut_batch([queue[i] for i in idx], size, max_queue_delay_s, now)
        if cut.take:
            return NextBatch(tuple(idx[k] for k in cut.take), background=background)
        waits.append(cut.wait_s)
    return NextBatch((), min(waits)) if waits else None
