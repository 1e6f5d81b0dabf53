"""Dynamic batcher: queued work items run through the model together, as one execution.

Policy (Triton's dynamic batcher, ``max_queue_delay_microseconds``): a batch starts as soon
as ``max_batch_size`` items are queued, or when the oldest queued item has waited
``max_queue_delay_s``, whichever comes first. A batch is filled round-robin over the callers
with queued items, in order of arrival (one item of each caller per round), so a caller with
many items (the windows of a long file) does not hold back a short one queued behind it.
That decision is the pure ``tideserve.worker.batching.cut_batch``, which the simulator calls
too; this module does the waiting and the execution. Executions run one at a time on a dedicated
thread (the model is not re-entrant); while one runs, new items queue and form the next
batch. Items whose caller went away (their future was cancelled, e.g. the client
disconnected) are dropped before execution, never computed.
"""

from __future__ import annotations

import asyncio
import collections
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Generic, Protocol, Sequence, TypeVar

from tideserve.aio import cancel_and_wait
from tideserve.worker.batching import QueuedItem, cut_batch

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class ExecutionTimings:
    """Seconds one execution spent in each phase (Triton's compute input/infer/output split)."""

    input_s: float = 0.0
    infer_s: float = 0.0
    output_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.input_s + self.infer_s + self.output_s


class BatcherObserver(Protocol):
    def on_enqueue(self, n: int) -> None: ...
    def on_dequeue(self, n: int) -> None: ...
    def on_dropped(self, n: int) -> None: ...
    def on_execution(self, batch_size: int, queue_s: Sequence[float], timings: ExecutionTimings) -> None: ...


class NullObserver:
    def on_enqueue(self, n: int) -> None: ...
    def on_dequeue(self, n: int) -> None: ...
    def on_dropped(self, n: int) -> None: ...
    def on_execution(self, batch_size: int, queue_s: Sequence[float], timings: ExecutionTimings) -> None: ...


@dataclass
class Usage:
    """Model time one caller used: the executions its items ran in, each counted once
    (as Triton charges every request of a batch the whole execution)."""

    compute_s: float = 0.0
    executions: set[int] = field(default_factory=set)


@dataclass
class _Item(Generic[T]):
    payload: T
    future: asyncio.Future
    caller: int = 0
    usage: Usage | None = None
    enqueued: float = field(default_factory=time.monotonic)


ExecuteFn = Callable[[list[T]], tuple[list[R], ExecutionTimings]]


class DynamicBatcher(Generic[T, R]):
    """Collect items from concurrent callers and run them through ``execute`` in batches.

    ``execute(payloads) -> (results, timings)`` must return one result per payload, in
    order; it runs on a single worker thread. When a batch of several items raises, each item is
    run again alone, so one bad input fails only its own caller (the others get their results,
    one execution each); a single item's exception goes to its caller.
    ``max_batch_size`` >= 1; ``max_queue_delay_s`` >= 0.
    """

    def __init__(
        self,
        execute: ExecuteFn,
        max_batch_size: int,
        max_queue_delay_s: float,
        observer: BatcherObserver | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if max_queue_delay_s < 0:
            raise ValueError("max_queue_delay_s must be >= 0")
        self._execute = execute
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_s
        self._observer = observer or NullObserver()
        self._queue: collections.deque[_Item[T]] = collections.deque()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self._task: asyncio.Task | None = None
        self.executions = 0
        self.busy = False
        self._callers = 0

    @property
    def queued(self) -> int:
        """Items waiting (cancelled ones not yet swept included)."""
        return len(self._queue)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="batcher")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        for item in self._queue:
            if not item.future.done():
                item.future.cancel()
        self._queue.clear()
        self._executor.shutdown(wait=True)

    async def submit_many(self, payloads: Sequence[T], usage: Usage | None = None) -> list[R]:
        """Queue ``payloads`` (e.g. the 30 s windows of one file); return their results in order.

        ``usage``, if given, accumulates the compute time of the executions the items ran in.
        If the caller is cancelled while the items wait, they are dropped unexecuted.
        """
        loop = asyncio.get_running_loop()
        self._callers += 1
        items = [_Item(p, loop.create_future(), self._callers, usage) for p in payloads]
        self._queue.extend(items)
        self._observer.on_enqueue(len(items))
        self._wakeup.set()
        try:
            return list(await asyncio.gather(*(i.future for i in items)))
        except asyncio.CancelledError:
            for i in items:
                i.future.cancel()
            # Take the caller's still-queued items out now, so that the pending count is exact.
            # Items already handed to an execution are not in the queue and run to the end.
            ids = {id(i) for i in items}
            before = len(self._queue)
            self._queue = collections.deque(i for i in self._queue if id(i) not in ids)
            removed = before - len(self._queue)
            if removed:
                self._observer.on_dequeue(removed)
                self._observer.on_dropped(removed)
            raise

    def _sweep(self) -> list[_Item[T]]:
        """Drop items whose caller went away; return the live ones, oldest first."""
        live = [i for i in self._queue if not i.future.done()]
        dropped = len(self._queue) - len(live)
        if dropped:
            self._observer.on_dequeue(dropped)
            self._observer.on_dropped(dropped)
            self._queue = collections.deque(live)
        return live

    def _deliver(self, batch: list, results: list, timings: ExecutionTimings, started: float) -> None:
        self._observer.on_execution(len(batch), [started - i.enqueued for i in batch], timings)
        for i in batch:
            if i.usage is not None and self.executions not in i.usage.executions:
                i.usage.executions.add(self.executions)
                i.usage.compute_s += timings.total_s
        for i, r in zip(batch, results):
            if not i.future.done():
                i.future.set_result(r)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            live = self._sweep()
            if not live:
                continue
            cut = cut_batch([QueuedItem(i.caller, i.enqueued) for i in live], self.max_batch_size,
                            self.max_queue_delay_s, time.monotonic())
            if not cut.take:
                # Wait for the oldest item's delay to run out, or for a new item (then decide again).
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), cut.wait_s)
                except asyncio.TimeoutError:
                    pass
                continue
            batch = [live[k] for k in cut.take]
            taken = {id(i) for i in batch}
            self._queue = collections.deque(i for i in live if id(i) not in taken)
            started = time.monotonic()
            self._observer.on_dequeue(len(batch))
            self.busy = True
            try:
                groups = [batch]
                while groups:
                    group = groups.pop(0)
                    try:
                        results, timings = await loop.run_in_executor(
                            self._executor, self._execute, [i.payload for i in group]
                        )
                        if len(results) != len(group):
                            raise RuntimeError(f"backend returned {len(results)} results for {len(group)} inputs")
                    except Exception as exc:  # noqa: BLE001 - every waiter must learn of the failure
                        self.executions += 1
                        if len(group) > 1:  # isolate the bad input: run each item alone
                            groups.extend([i] for i in group if not i.future.done())
                            continue
                        if not group[0].future.done():
                            group[0].future.set_exception(exc)
                        continue
                    self.executions += 1
                    self._deliver(group, results, timings, started)
            finally:
                self.busy = False
