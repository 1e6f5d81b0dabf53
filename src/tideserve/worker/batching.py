"""The dynamic batcher's decision, pure: when to cut a batch and which queued items go in it.

Policy (Triton's dynamic batcher, ``max_queue_delay_microseconds``): a batch is cut as soon as
``max_batch_size`` items are queued, or once the oldest queued item has waited
``max_queue_delay_s``, whichever comes first. The batch is filled round-robin over the callers
with queued items, in order of arrival (one item of each caller per round), so a caller with many
items (the windows of a long file) does not hold back a short one queued behind it.

A replica may run several model instances at once (Triton's ``instance_group`` count; the
faster-whisper backend's CTranslate2 workers), each executing one batch. The last free instance
of several is kept for callers with nothing executing (``schedulable``): one caller with many
items (a 20-minute file) may fill every instance but one, so a short request arriving meanwhile
starts at once instead of waiting for a batch of 30 s windows to end (issue 13, fairness).

No clock and no I/O: ``now`` is an argument, so the worker's engine loop and the simulator
(``tideserve.sim``) make the same decision from the same queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Collection, Sequence


@dataclass(frozen=True)
class QueuedItem:
    """One queued item as the decision sees it: its ``caller`` (items of one request share it)
    and when it was queued, ``enqueued_s``, on the same clock as ``now``."""

    caller: int
    enqueued_s: float


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


def schedulable(queue: Sequence[QueuedItem], executing: Collection[int], free_instances: int,
                instances: int) -> list[int]:
    """Indices of the ``queue`` items that may start on a free model instance now.

    ``executing``: callers with an item executing on some instance; ``free_instances`` of
    ``instances`` are idle. With one instance, or more than one free, every item may start;
    the last free instance of several takes only callers in ``executing``'s complement.

    Raises ValueError when ``instances`` < 1 or ``free_instances`` is not in 1..``instances``.
    """
    if instances < 1:
        raise ValueError(f"instances {instances} must be >= 1")
    if not 1 <= free_instances <= instances:
        raise ValueError(f"free_instances {free_instances} must be in 1..{instances}")
    if instances == 1 or free_instances > 1:
        return list(range(len(queue)))
    return [i for i, item in enumerate(queue) if item.caller not in executing]
