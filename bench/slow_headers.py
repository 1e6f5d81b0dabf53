"""Slow-header ("slowloris") sockets against a running gateway: are they all closed by the
server, and what do they do to other clients' latency? Not part of CI (minutes).

    tideserve up examples/whisper-tiny-en.yaml &      # or any running gateway
    .venv/bin/python bench/slow_headers.py --url http://127.0.0.1:8080 --sockets 500 --hold-s 120 \\
        --json bench/results/slow_headers.json

Phases: (1) other clients alone: sequential GETs of the model's metadata (answered by the gateway
itself) for ``--probe-s`` seconds give a p50; (2) for ``--hold-s`` seconds ``--sockets`` slow
connections are kept open: each sends a partial request and one more header byte every
``--trickle-s`` seconds, and each one the server closes is replaced by a new one at once, from
``--sources`` loopback addresses in turn (127.0.0.2, 127.0.0.3, ...: the per-address cap is not
what closes them), while the same probes run; (3) no new sockets: the remaining ones keep
trickling until the server closes them, at most ``--drain-s`` seconds. Prints (and writes with
``--json``): sockets opened, closed by the server, left open, when they were closed (seconds
after opening), the two p50s and their ratio. Exit code 1 if a socket was left open.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx


def probe(client: httpx.Client, path: str, seconds: float) -> tuple[list[float], int]:
    """Latencies in ms of sequential GETs for ``seconds``, and how many were not 200."""
    lat, bad, end = [], 0, time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        r = client.get(path)
        lat.append((time.perf_counter() - t) * 1000)
        bad += r.status_code != 200
    return lat, bad


class SlowSockets:
    """``n`` slow-header connections to ``(host, port)``, replaced as the server closes them."""

    def __init__(self, host: str, port: int, n: int, sources: int, trickle_s: float) -> None:
        self.addr, self.sources, self.trickle_s = (host, port), max(1, sources), trickle_s
        self.open: dict[socket.socket, float] = {}  # socket -> when it was opened (monotonic)
        self.opened = self.closed = self.answered_429 = self.connect_errors = 0
        self.lifetimes: list[float] = []
        for _ in range(n):
            self._open_one()

    def _open_one(self) -> None:
        s = socket.socket()
        try:
            s.bind((f"127.0.0.{2 + self.opened % self.sources}", 0))
            s.connect(self.addr)
            s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        except OSError:
            self.connect_errors += 1
            s.close()
            return
        s.setblocking(False)
        self.open[s] = time.monotonic()
        self.opened += 1

    def step(self, replace: bool) -> None:
        """Send one header byte on every open socket; record and (if ``replace``) replace the
        ones the server has closed."""
        for s in list(self.open):
            gone = False
            try:
                data = s.recv(4096)
                gone = True  # an answer (429) or EOF: the server ended it
                self.answered_429 += data.startswith(b"HTTP/1.1 429")
            except BlockingIOError:
                try:
                    s.send(b"a")
                except OSError:
                    gone = True
            except OSError:
                gone = True
            if gone:
                self.lifetimes.append(time.monotonic() - self.open.pop(s))
                self.closed += 1
                s.close()
                if replace:
                    self._open_one()

    def run(self, seconds: float, replace: bool) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and (replace or self.open):
            self.step(replace)
            time.sleep(self.trickle_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--sockets", type=int, default=500)
    p.add_argument("--sources", type=int, default=4, help="loopback source addresses 127.0.0.2 ... to spread sockets over")
    p.add_argument("--hold-s", type=float, default=120.0, help="how long slow sockets are kept open (replaced when closed)")
    p.add_argument("--drain-s", type=float, default=60.0, help="after the hold: longest wait for the server to close the rest")
    p.add_argument("--trickle-s", type=float, default=2.0, help="seconds between header bytes")
    p.add_argument("--probe-s", type=float, default=30.0, help="how long the baseline probes run")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    u = urlparse(args.url)
    host, port = u.hostname or "127.0.0.1", u.port or 80

    client = httpx.Client(base_url=args.url, timeout=30)
    model = client.get("/v1/models").json()["data"][0]["id"]
    path = f"/v2/models/{model}"
    probe(client, path, 2)  # warm up
    alone, alone_bad = probe(client, path, args.probe_s)

    slow = SlowSockets(host, port, args.sockets, args.sources, args.trickle_s)
    attack = threading.Thread(target=slow.run, args=(args.hold_s, True), daemon=True)
    attack.start()
    loaded, loaded_bad = probe(client, path, args.hold_s)
    attack.join()
    slow.run(args.drain_s, replace=False)
    left_open = len(slow.open)
    for s in slow.open:
        s.close()
    life = sorted(slow.lifetimes)
    out = {
        "command": "python bench/slow_headers.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "url": args.url, "sockets_kept_open": args.sockets, "sources": args.sources, "hold_s": args.hold_s,
        "sockets_opened": slow.opened, "closed_by_server": slow.closed, "left_open": left_open,
        "answered_429": slow.answered_429, "connect_errors": slow.connect_errors,
        "seconds_open_before_closed": {"min": round(life[0], 2), "p50": round(statistics.median(life), 2),
                                       "max": round(life[-1], 2)} if life else None,
        "probe_path": path, "probes_alone": len(alone), "probes_with_slow_sockets": len(loaded),
        "p50_ms_alone": round(statistics.median(alone), 3),
        "p50_ms_with_slow_sockets": round(statistics.median(loaded), 3),
        "p50_ratio": round(statistics.median(loaded) / statistics.median(alone), 3),
        "p99_ms_alone": round(statistics.quantiles(alone, n=100)[98], 3),
        "p99_ms_with_slow_sockets": round(statistics.quantiles(loaded, n=100)[98], 3),
        "probe_errors": alone_bad + loaded_bad,
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 1 if left_open else 0


if __name__ == "__main__":
    raise SystemExit(main())
