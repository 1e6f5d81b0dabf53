"""A prep process that holds a request past ``PrepPool(stall_s=...)`` (local config's
``prep_stall_s``; stopped or hung) is ended with the pool, and the request is tried once more on
a new pool: a stopped prep process used to hold its request until the request timed out (504),
found by an adversarial helper."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tideserve.worker.prep import PrepPool, PrepProcessDied


def _pool_started(pool: PrepPool) -> list[int]:
    pool.start()
    deadline = time.monotonic() + 60
    while not pool.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pool.pids()


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


def test_a_request_held_by_a_stopped_prep_process_is_answered_by_a_new_one() -> None:
    pool = PrepPool(1, stall_s=1.0)
    try:
        (stopped,) = _pool_started(pool)
        os.kill(stopped, signal.SIGSTOP)
        started = time.monotonic()
        assert asyncio.run(pool.run(time.sleep, 0)) is None  # answered, by the new pool's process
        assert time.monotonic() - started < 30
        assert pool.replaced == 1 and stopped not in pool.pids()
        assert _gone(stopped)
    finally:
        pool.close()


def test_a_call_that_never_ends_fails_with_a_clear_503_after_two_tries() -> None:
    pool = PrepPool(1, stall_s=1.0)
    try:
        _pool_started(pool)
        with pytest.raises(PrepProcessDied, match="no progress for 1 s"):
            asyncio.run(pool.run(time.sleep, 600))
        assert pool.replaced == 2
        assert asyncio.run(pool.run(time.sleep, 0)) is None  # the third pool serves
    finally:
        pool.close()


def test_a_stall_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="stall_s must be > 0"):
        PrepPool(1, stall_s=0)


def test_time_queued_behind_busy_processes_does_not_count() -> None:
    pool = PrepPool(1, stall_s=3.0)
    try:
        _pool_started(pool)

        async def burst() -> list:
            # eight calls of 0.5 s on one process: the last ends 4 s after it was sent, each
            # about 1 s after a process took it
            return await asyncio.gather(*(pool.run(time.sleep, 0.5) for _ in range(8)))

        assert asyncio.run(burst()) == [None] * 8
        assert pool.replaced == 0
    finally:
        pool.close()
