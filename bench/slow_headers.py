"""Slow-header ("slowloris") sockets against a running gateway: are they all closed by the
server, and what do they do to other clients' latency? Not part of CI.

    .venv/bin/python bench/slow_headers.py --url http://127.0.0.1:8080 --sockets 200 --hold-s 60

Phases: (1) other clients alone: ``--probes`` sequential GETs of the model's metadata (answered by
the gateway itself) give a p50; (2) ``--sockets`` connections each send a partial request and one
more header byte every ``--trickle-s`` seconds for ``--hold-s`` seconds, from ``--sources``
loopback addresses in turn (127.0.0.2, 127.0.0.3, ...: the per-address cap is not what closes
them) while the same probes run again; the time at which the server closed each socket is
recorded. Prints JSON: sockets closed by the server (and when), left open at the end, the two
p50s and their ratio. Exit code 1 if a socket was left open.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from urllib.parse import urlparse

import httpx


def probe_p50(client: httpx.Client, path: str, n: int) -> tuple[float, int]:
    """Median latency in ms of ``n`` sequential GETs, and how many were not 200."""
    lat, bad = [], 0
    for _ in range(n):
        t = time.perf_counter()
        r = client.get(path)
        lat.append((time.perf_counter() - t) * 1000)
        bad += r.status_code != 200
    return statistics.median(lat), bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--sockets", type=int, default=200)
    p.add_argument("--sources", type=int, default=2, help="loopback source addresses 127.0.0.2 ... to spread sockets over")
    p.add_argument("--hold-s", type=float, default=60.0, help="how long each slow socket keeps trickling")
    p.add_argument("--trickle-s", type=float, default=2.0, help="seconds between header bytes")
    p.add_argument("--probes", type=int, default=300)
    args = p.parse_args(argv)
    u = urlparse(args.url)
    host, port = u.hostname or "127.0.0.1", u.port or 80

    client = httpx.Client(base_url=args.url, timeout=30)
    model = client.get("/v1/models").json()["data"][0]["id"]
    path = f"/v2/models/{model}"
    probe_p50(client, path, 20)  # warm up
    base_p50, base_bad = probe_p50(client, path, args.probes)

    closed_at: dict[int, float] = {}
    refused = 0
    lock = threading.Lock()
    started = time.monotonic()
    socks: list[socket.socket] = []
    for i in range(args.sockets):
        src = f"127.0.0.{2 + i % max(1, args.sources)}"
        s = socket.socket()
        s.bind((src, 0))
        s.connect((host, port))
        s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        s.setblocking(False)
        socks.append(s)

    def trickle() -> None:
        nonlocal refused
        while time.monotonic() - started < args.hold_s:
            for i, s in enumerate(socks):
                if i in closed_at:
                    continue
                try:
                    data = s.recv(4096)
                    with lock:
                        closed_at[i] = time.monotonic() - started
                        refused += data.startswith(b"HTTP/1.1 429")
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    with lock:
                        closed_at[i] = time.monotonic() - started
                    continue
                try:
                    s.send(b"a")
                except OSError:
                    with lock:
                        closed_at[i] = time.monotonic() - started
            time.sleep(args.trickle_s)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    time.sleep(0.5)
    load_p50, load_bad = probe_p50(client, path, args.probes)
    t.join()
    for s in socks:
        s.close()
    times = sorted(closed_at.values())
    out = {
        "url": args.url, "sockets": args.sockets, "sources": args.sources, "hold_s": args.hold_s,
        "closed_by_server": len(closed_at), "left_open": args.sockets - len(closed_at), "answered_429": refused,
        "close_time_s": {"min": round(times[0], 2), "p50": round(statistics.median(times), 2),
                         "max": round(times[-1], 2)} if times else None,
        "probe_path": path, "probes": args.probes,
        "p50_ms_alone": round(base_p50, 2), "p50_ms_with_slow_sockets": round(load_p50, 2),
        "p50_ratio": round(load_p50 / base_p50, 3), "probe_errors": base_bad + load_bad,
    }
    print(json.dumps(out, indent=2))
    return 1 if out["left_open"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
