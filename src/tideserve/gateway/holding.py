"""Holding semantics of the gateway, pure: may a request wait for capacity, and until when.

A request that no ready replica can take waits ("is held") while fewer than ``max_pending``
requests already wait; otherwise it is refused (503, Retry-After). A held request gives up
``hold_timeout_s`` after it started waiting (503). No clock: times are arguments, so the
gateway's ``Dispatcher`` and the simulator apply the same rule.
"""

from __future__ import annotations

from tideserve.core import hold_deadline, may_hold

__all__ = ["hold_deadline", "may_hold"]
