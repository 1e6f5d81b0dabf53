"""Kubernetes readiness probe of a worker: ``python -m tideserve.worker.probe [--port N]``.

kubelet's ``httpGet`` probes cannot carry a secret, and a worker answers ``/v2/health/ready``
only with its gateway's token, so the worker's readiness and startup probes run this instead: it
asks ``http://127.0.0.1:PORT/v2/health/ready`` with the token from ``TIDESERVE_WORKER_TOKEN``
(the env var the worker itself reads) and exits 0 on 200, 1 otherwise (the status or the error
is printed, and kubelet shows it in the pod's events). Standard library only, so a probe costs
an interpreter start (tens of ms) and nothing else.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys

from tideserve.protocol.internal import TOKEN_HEADER


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tideserve.worker.probe", description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8000, help="the worker's HTTP port (default 8000)")
    ap.add_argument("--timeout-s", type=float, default=4.0, help="seconds to wait for the answer")
    args = ap.parse_args(argv)
    token = os.environ.get("TIDESERVE_WORKER_TOKEN", "")
    conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=args.timeout_s)
    try:
        conn.request("GET", "/v2/health/ready", headers={TOKEN_HEADER: token} if token else {})
        status = conn.getresponse().status
    except OSError as exc:
        print(f"worker not answering on port {args.port}: {exc}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    if status != 200:
        print(f"/v2/health/ready answered {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
