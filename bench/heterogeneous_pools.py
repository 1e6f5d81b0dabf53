"""Real int8 vs fp32 speed on this machine, and where the gateway routes because of it.

Two CPU pools of tiny.en, one replica each (int8 and fp32 engines), behind one gateway; a
burst of requests from concurrent clients. Prints each pool's service rate as the gateway
measured it and how many requests it routed to each pool. On an idle x86 machine int8 is about
2x fp32 and so gets most requests; on a loaded machine the two can come out close, which is why
this comparison is a benchmark and not a test (the routing rule is tested on scripted service
times: tests/unit/gateway/test_service_rate_routing.py).

Run: ``.venv/bin/python bench/heterogeneous_pools.py --requests 36 --concurrency 4``.
"""

from __future__ import annotations

import argparse
import base64
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from endpoint import EndpointProcess, write_endpoint  # noqa: E402


def clips() -> list[bytes]:
    import pytest_audioeval

    d = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "en"
    return [p.read_bytes() for p in sorted(d.glob("*.wav"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=36)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    bodies = [{"audio_data": base64.b64encode(w).decode()} for w in clips()]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_endpoint(Path(tmp), pools=[
            {"name": "cpu-int8", "accelerator": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 1, "max": 1},
             "max_concurrency": 4, "cost_usd_per_h": 0.10},
            {"name": "cpu-fp32", "accelerator": "cpu", "target": "cpu-x86_64-fp32", "replicas": {"min": 1, "max": 1},
             "max_concurrency": 4, "cost_usd_per_h": 0.20},
        ], batching={"max_batch_size": 1, "max_queue_delay_ms": 0})
        with EndpointProcess(path, Path(tmp)) as ep:
            started = time.monotonic()
            with ep.client(timeout=300) as client, ThreadPoolExecutor(args.concurrency) as pool:
                codes = list(pool.map(lambda i: client.post("/invocations", json=bodies[i % len(bodies)]).status_code,
                                      range(args.requests)))
            wall = time.monotonic() - started
            rates = ep.status()["gateway"]["service_rates"]
            metrics = ep.client().get("/metrics").text
    routed = {}
    for line in metrics.splitlines():
        if line.startswith("tideserve_routing_decisions_total"):
            routed[line.split('pool="')[1].split('"')[0]] = int(float(line.split()[-1]))
    print(f"{args.requests} requests, concurrency {args.concurrency}: {wall:.1f} s, "
          f"{sum(c == 200 for c in codes)} answered 200")
    for p in ("cpu-int8", "cpu-fp32"):
        print(f"  {p:<9} measured {rates.get(p, 0.0):6.3f} req/s per replica   routed {routed.get(p, 0)}")
    if rates.get("cpu-fp32"):
        print(f"  int8 / fp32 service rate: {rates.get('cpu-int8', 0.0) / rates['cpu-fp32']:.2f}")


if __name__ == "__main__":
    main()
