from __future__ import annotations

import asyncio

import pytest

from tideserve.worker.batcher import DynamicBatcher, ExecutionTimings


class Recorder:
    def __init__(self):
        self.batches: list[list] = []
        self.pending = 0
        self.dropped = 0

    def execute(self, items):
        self.batches.append(list(items))
        return [x * 10 for x in items], ExecutionTimings(infer_s=0.001)

    def on_enqueue(self, n): self.pending += n
    def on_dequeue(self, n): self.pending -= n
    def on_dropped(self, n): self.dropped += n
    def on_execution(self, batch_size, queue_s, timings): pass


def run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_share_executions_and_get_their_own_results():
    async def main():
        rec = Recorder()
        b = DynamicBatcher(rec.execute, max_batch_size=4, max_queue_delay_s=10.0, observer=rec)
        b.start()
        # 4 windows from 3 callers fill a batch of 4: no waiting for the 10 s delay.
        results = await asyncio.wait_for(asyncio.gather(b.submit_many([1]), b.submit_many([2, 3]), b.submit_many([4])), 5)
        await b.close()
        return rec, results, b.executions

    rec, results, executions = run(main())
    assert results == [[10], [20, 30], [40]]
    # One execution, filled round-robin over the three callers: 1, 2, 4, then the second of 2-3.
    assert rec.batches == [[1, 2, 4, 3]] and executions == 1 and rec.pending == 0


def test_max_batch_size_splits_batches_in_arrival_order():
    async def main():
        rec = Recorder()
        b = DynamicBatcher(rec.execute, max_batch_size=2, max_queue_delay_s=0.0, observer=rec)
        b.start()
        out = await asyncio.gather(*(b.submit_many([i]) for i in range(5)))
        await b.close()
        return rec, out

    rec, out = run(main())
    assert out == [[0], [10], [20], [30], [40]]
    assert [len(x) for x in rec.batches] == [2, 2, 1]
    assert [x for batch in rec.batches for x in batch] == [0, 1, 2, 3, 4]


def test_cancelled_caller_is_dropped_before_execution():
    async def main():
        rec = Recorder()
        b = DynamicBatcher(rec.execute, max_batch_size=8, max_queue_delay_s=10.0, observer=rec)
        b.start()
        gone = asyncio.ensure_future(b.submit_many([666, 667]))
        await asyncio.sleep(0)  # let it enqueue
        assert rec.pending == 2
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert rec.pending == 0 and rec.dropped == 2 and b.queued == 0
        kept = await asyncio.wait_for(asyncio.gather(*(b.submit_many([i]) for i in range(8))), 5)
        await b.close()
        return rec, kept

    rec, kept = run(main())
    assert all(666 not in batch and 667 not in batch for batch in rec.batches)
    assert kept == [[i * 10] for i in range(8)]


def test_a_bad_input_fails_only_its_own_caller():
    calls = []

    def execute(items):
        calls.append(list(items))
        if -1 in items:
            raise RuntimeError("model blew up on -1")
        return [i * 10 for i in items], ExecutionTimings()

    async def main():
        b = DynamicBatcher(execute, max_batch_size=3, max_queue_delay_s=0.05)
        b.start()
        got = await asyncio.gather(b.submit_many([1]), b.submit_many([-1]), b.submit_many([2]),
                                   return_exceptions=True)
        await b.close()
        return got, b.executions

    (a, bad, c), executions = run(main())
    assert (a, c) == ([10], [20])
    assert isinstance(bad, RuntimeError) and str(bad) == "model blew up on -1"
    # One batch of three failed, then each input ran alone: 4 executions.
    assert calls == [[1, -1, 2], [1], [-1], [2]] and executions == 4


def test_a_single_failing_item_gets_the_exception_and_the_batcher_goes_on():
    calls = []

    def execute(items):
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("model blew up")
        return items, ExecutionTimings()

    async def main():
        b = DynamicBatcher(execute, max_batch_size=2, max_queue_delay_s=0.0)
        b.start()
        with pytest.raises(RuntimeError, match="model blew up"):
            await b.submit_many([1])
        ok = await b.submit_many([3])
        await b.close()
        return ok, b.executions

    assert run(main()) == ([3], 2)


def test_wrong_result_count_is_an_error():
    async def main():
        b = DynamicBatcher(lambda items: ([], ExecutionTimings()), max_batch_size=2, max_queue_delay_s=0.0)
        b.start()
        with pytest.raises(RuntimeError, match="returned 0 results for 1 inputs"):
            await b.submit_many([1])
        await b.close()

    run(main())


def test_max_batch_size_must_be_positive():
    with pytest.raises(ValueError):
        DynamicBatcher(lambda x: (x, ExecutionTimings()), 0, 0.0)


def test_batches_are_filled_round_robin_over_callers():
    """A long file's many windows do not hold back a short request queued after them."""
    async def main():
        rec = Recorder()
        b = DynamicBatcher(rec.execute, max_batch_size=2, max_queue_delay_s=0.0, observer=rec)
        long = asyncio.ensure_future(b.submit_many([1, 2, 3, 4, 5, 6]))
        short = asyncio.ensure_future(b.submit_many([100]))
        await asyncio.sleep(0)
        b.start()
        out = await asyncio.gather(long, short)
        await b.close()
        return rec, out

    rec, out = run(main())
    assert out == [[10, 20, 30, 40, 50, 60], [1000]]
    assert rec.batches[0] == [1, 100]  # the short request rides in the first execution
    assert [x for batch in rec.batches for x in batch if x != 100] == [1, 2, 3, 4, 5, 6]
