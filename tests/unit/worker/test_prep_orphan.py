"""A request cancelled while its prep process works (the client went away) still has its audio
handed to the engine by that process: ``PrepPool.run_once`` then reports the result through
``orphaned`` once the process is done, so the front can drop it there; a call cancelled before a
process took it, or one that failed, handed nothing on and is not reported."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib

from tideserve.worker.prep import PrepPool, _settle_orphan


def test_only_a_call_that_completed_is_reported() -> None:
    seen: list = []
    ok: concurrent.futures.Future = concurrent.futures.Future()
    ok.add_done_callback(lambda f: _settle_orphan(f, seen.append))
    ok.set_result("prepared")
    never_ran: concurrent.futures.Future = concurrent.futures.Future()
    never_ran.add_done_callback(lambda f: _settle_orphan(f, seen.append))
    assert never_ran.cancel()
    failed: concurrent.futures.Future = concurrent.futures.Future()
    failed.add_done_callback(lambda f: _settle_orphan(f, seen.append))
    failed.set_exception(ValueError("undecodable audio"))
    assert seen == ["prepared"]


def test_a_call_cancelled_by_its_caller_is_reported_when_it_completes() -> None:
    class Gate:
        """Stands in for the process pool: the call completes when the test says so."""

        def __init__(self) -> None:
            self.future: concurrent.futures.Future = concurrent.futures.Future()

        def submit(self, fn, *args):
            self.future.set_running_or_notify_cancel()  # a process took it
            return self.future

    async def main() -> list:
        pool = PrepPool.__new__(PrepPool)  # no processes: only run_once's bookkeeping is under test
        gate = Gate()
        pool._pool = gate  # type: ignore[assignment]
        pool.stall_s, pool._stalled = None, set()  # no stall watch: the test ends the call itself
        orphans: list = []
        task = asyncio.ensure_future(pool.run_once(print, "x", orphaned=orphans.append))
        await asyncio.sleep(0)  # run_once submitted and awaits
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert orphans == []  # still running in its process
        gate.future.set_result("prepared")
        return orphans

    assert asyncio.run(main()) == ["prepared"]
