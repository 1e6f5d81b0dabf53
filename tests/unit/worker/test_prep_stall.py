"""A prep process that stops or hangs is taken for dead after ``PrepPool(stall_s=...)`` (local
config's ``prep_stall_s``): no heartbeat for that long, or one request held that long since a
process took it. The pool's processes are ended and replaced and the requests they held are
tried once more. A stopped prep process used to hold its request until the request timed out
(504); an adversarial helper then found the first version (a per-call clock from when the
executor marked the call running) blind to stopped idle processes behind cancelled calls,
killing healthy calls queued in the executor's call queue, and reporting calls cancelled by the
pool's replacement as clients gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator

import pytest

from tideserve.worker.prep import PrepPool, PrepProcessDied


@contextlib.contextmanager
def _started_pool(stall_s: float = 2.0) -> Iterator[tuple[PrepPool, int]]:
    """A one-process pool with its process started: ``(pool, its pid)``; closed after."""
    pool = PrepPool(1, stall_s=stall_s)
    try:
        pool.start()
        deadline = time.monotonic() + 60
        while not pool.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        (pid,) = pool.pids()
        yield pool, pid
    finally:
        pool.close()


def _gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # ended, not yet reaped
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_requests_held_by_a_stopped_prep_process_are_all_answered_by_a_new_one() -> None:
    with _started_pool() as (pool, stopped):
        os.kill(stopped, signal.SIGSTOP)
        started = time.monotonic()

        async def burst() -> list:
            return await asyncio.gather(*(pool.run(time.sleep, 0) for _ in range(8)))

        assert asyncio.run(burst()) == [None] * 8  # none failed, none read as a client gone
        assert time.monotonic() - started < 30
        assert pool.replaced == 1 and stopped not in pool.pids()
        assert _gone(stopped)


def test_a_stopped_idle_process_behind_cancelled_calls_is_found() -> None:
    with _started_pool() as (pool, stopped):
        os.kill(stopped, signal.SIGSTOP)

        async def main() -> None:
            gone = [asyncio.ensure_future(pool.run(time.sleep, 0)) for _ in range(3)]
            await asyncio.sleep(0.5)
            for task in gone:  # clients that went away: their calls stay in the executor's queue
                task.cancel()
            for task in gone:
                with contextlib.suppress(asyncio.CancelledError, PrepProcessDied):
                    await task
            assert await asyncio.wait_for(pool.run(time.sleep, 0), 30) is None

        asyncio.run(main())
        assert pool.replaced >= 1 and _gone(stopped)


def test_a_call_that_never_ends_fails_with_a_clear_503_after_two_tries() -> None:
    with _started_pool() as (pool, _):
        with pytest.raises(PrepProcessDied, match="stopped making progress"):
            asyncio.run(pool.run(time.sleep, 600))
        assert pool.replaced == 2
        assert asyncio.run(pool.run(time.sleep, 0)) is None  # the third pool serves


def test_time_queued_behind_busy_processes_does_not_count() -> None:
    with _started_pool() as (pool, _):

        async def burst() -> list:
            # three calls of 1.5 s on one process: the last ends 4.5 s after it was sent, and the
            # second waits in the executor's call queue (marked running) while the first runs
            return await asyncio.gather(*(pool.run(time.sleep, 1.5) for _ in range(3)))

        assert asyncio.run(burst()) == [None] * 3
        assert pool.replaced == 0


def test_a_stall_limit_must_leave_room_for_heartbeats() -> None:
    with pytest.raises(ValueError, match="stall_s must be >= 2"):
        PrepPool(1, stall_s=1.0)
