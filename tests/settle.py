"""Waiting for a state in asyncio tests without wall-clock sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

#: Event-loop turns allowed before a condition counts as never reached. Tasks in these tests
#: need a handful of turns; the bound only turns a bug into a failure instead of a hang.
MAX_TURNS = 10_000


async def settle(cond: Callable[[], bool], what: str, max_turns: int = MAX_TURNS) -> None:
    """Yield to the event loop (``sleep(0)``, no wall-clock wait) until ``cond()`` holds.
    Raises AssertionError naming ``what`` if it does not within ``max_turns`` turns."""
    for _ in range(max_turns):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never reached: {what}")
