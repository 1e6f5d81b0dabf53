"""KServe v2 over gRPC against HTTP on the same clip, side by side in one run (issue 17): the
ratio of per-request latency (one client, sequential) and of requests per second at 8 clients,
with the real ``tritonclient.grpc`` and ``tritonclient.http``. Not part of CI.

    tideserve up ENDPOINT_WITH_grpc_port &           # e.g. the default example plus grpc_port: 8001
    .venv/bin/python bench/grpc_vs_http.py --http 127.0.0.1:8080 --grpc 127.0.0.1:8001 --rounds 3 \\
        --json bench/results/grpc_vs_http.json

Each round runs HTTP then gRPC (sequential latency over ``--requests`` requests, then 8
concurrent clients for ``--requests`` x 2 requests), so machine noise falls on both; medians
over rounds, ratios grpc/http.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

MODEL = "whisper-tiny.en"


def clip() -> bytes:
    import pytest_audioeval

    return (Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "en" / "hello_world.wav").read_bytes()


def one(kind: str, url: str, wav: bytes):
    mod = tgrpc if kind == "grpc" else thttp
    client = mod.InferenceServerClient(url=url) if kind == "grpc" else mod.InferenceServerClient(url=url, network_timeout=120)
    audio = mod.InferInput("AUDIO", [1], "BYTES")
    audio.set_data_from_numpy(np.array([wav], dtype=np.object_))

    def call() -> float:
        t = time.perf_counter()
        text = client.infer(MODEL, [audio]).as_numpy("TEXT")[0]
        assert text, "empty transcript"
        return time.perf_counter() - t

    return call


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--http", default="127.0.0.1:8080")
    ap.add_argument("--grpc", default="127.0.0.1:8001")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    wav = clip()
    urls = {"http": args.http, "grpc": args.grpc}
    for kind in urls:  # warm up
        call = one(kind, urls[kind], wav)
        for _ in range(3):
            call()
    lat: dict[str, list[float]] = {"http": [], "grpc": []}
    rps: dict[str, list[float]] = {"http": [], "grpc": []}
    for _ in range(args.rounds):
        for kind, url in urls.items():
            call = one(kind, url, wav)
            lat[kind].append(statistics.median(call() for _ in range(args.requests)))
            n_each = max(1, args.requests * 2 // args.clients)

            def client_loop(_: int, kind: str = kind, url: str = url, n_each: int = n_each) -> None:
                call = one(kind, url, wav)  # in its own thread: tritonclient.http is not thread-safe
                for _ in range(n_each):
                    call()

            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                list(pool.map(client_loop, range(args.clients)))
            rps[kind].append(n_each * args.clients / (time.perf_counter() - t0))
    out = {
        "command": "python bench/grpc_vs_http.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "clip": "hello_world.wav (pytest-audioeval, 1.1 s)", "rounds": args.rounds,
        "latency_s_median": {k: round(statistics.median(v), 4) for k, v in lat.items()},
        "req_per_s_median_at_clients": {k: round(statistics.median(v), 2) for k, v in rps.items()},
        "clients": args.clients,
        "ratio_latency_grpc_to_http": round(statistics.median(lat["grpc"]) / statistics.median(lat["http"]), 3),
        "ratio_req_per_s_grpc_to_http": round(statistics.median(rps["grpc"]) / statistics.median(rps["http"]), 3),
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
