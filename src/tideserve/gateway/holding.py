"""Holding semantics of the gateway, pure: may a request wait for capacity, and until when.

A request that no ready replica can take waits ("is held") while fewer than ``max_pending``
requests already wait; otherwise it is refused (503, Retry-After). A held request gives up
``hold_timeout_s`` after it started waiting (503). No clock: times are arguments, so the
gateway's ``Dispatcher`` and the simulator apply the same rule.
"""

from __future__ import annotations


def may_hold(pending: int, max_pending: int) -> bool:
    """True when one more request may wait: ``pending`` (already waiting) < ``max_pending``."""
    return pending < max_pending


def hold_deadline(held_at: float, hold_timeout_s: float) -> float:
    """When a request held since ``held_at`` gives up (same clock and unit, s)."""
    return held_at + hold_timeout_s
