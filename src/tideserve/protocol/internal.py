"""Headers between the gateway (or the local runtime) and its workers; never sent by clients.

Defined once here so the gateway, the runtime and the worker agree.
"""

from __future__ import annotations

#: The shared secret a worker requires on every route but liveness (the gateway, the runtime's
#: readiness checks and the Kubernetes readiness probe send it). A worker also takes it as
#: ``Authorization: Bearer TOKEN``, which is what Prometheus's scrape ``authorization`` sends.
TOKEN_HEADER = "X-Tideserve-Token"

#: Set by workers on each answer: model compute time the request used, in milliseconds (text).
COMPUTE_HEADER = "X-Tideserve-Compute-Ms"
