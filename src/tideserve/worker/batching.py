"""The dynamic batcher's decision, pure: when to cut a batch and which queued items go in it.

Policy (Triton's dynamic batcher, ``max_queue_delay_microseconds``): a batch is cut as soon as
``max_batch_size`` items are queued, or once the oldest queued item has waited
``max_queue_delay_s``, whichever comes first. The batch is filled round-robin over the callers
with queued items, in order of arrival (one item of each caller per round), so a caller with many
items (the windows of a long file) does not hold back a short one queued behind it.

No clock and no I/O: ``now`` is an argument, so the worker's asyncio ``DynamicBatcher`` and the
simulator (``tideserve.sim``) make the same decision from the same queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence


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
