"""CPU the worker's HTTP front spends per request, with the model taken out (issue 12).

On the H200 the served path of tiny.en ran at 0.75 of its engine with the front process at one
full core (bench/results/gpu_e2e_h200_before_handoff.json, ``cpu_cores_by_process``): at ~230 requests/s the
front, not the GPU, set the pace. This bench runs the real worker (``WorkerService``, prep
processes, engine process, aiohttp app) over a backend that answers every window at once, so
what is measured is the front's own work: HTTP, handing bodies to the prep processes, carrying
the PCM to the engine, results back. Clients (another process) post ``/invocations`` bodies of
real speech, 1-60 s (the shipped clips joined), closed loop.

    .venv/bin/python bench/front_cpu.py --clients 64 --requests 2000
    .venv/bin/python bench/front_cpu.py --base /tmp/base ...   # another tree side by side

Prints per run: requests/s, audio-s/s and the front's CPU milliseconds per request (its own
``getrusage`` user+system, children excluded), and the prep and engine processes' CPU. With
``--base``, the two trees take turns round after round and the ratio this/base is printed
(median over rounds); the machine's noise falls on both.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SR = 16_000
LENGTHS_S = (1, 2, 4, 8, 12, 18, 28, 45, 60)


class NullBackend:
    """A static backend that answers each window at once with a fixed text."""

    languages = frozenset({"en"})

    def __init__(self, *args, **kwargs) -> None:
        pass

    def transcribe_batch(self, tasks):
        from tideserve.worker.backends.base import WindowResult
        from tideserve.worker.timings import ExecutionTimings

        return ([WindowResult(text="hello world", language="en", avg_logprob=-0.1, compression_ratio=1.0)
                 for _ in tasks], ExecutionTimings(0.0, 0.0, 0.0))


def bodies() -> list[tuple[bytes, float]]:
    """JSON ``/invocations`` bodies of 1-60 s of the shipped English clips joined."""
    import pytest_audioeval

    from longfiles import wav_pcm16
    from tideserve.worker.audio import decode_pcm16

    d = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "en"
    speech = np.concatenate([decode_pcm16(p.read_bytes()) for p in sorted(d.glob("*.wav"))] * 30)
    out = []
    for s in LENGTHS_S:
        wav = wav_pcm16(speech[: s * SR])
        out.append((json.dumps({"audio_data": base64.b64encode(wav).decode()}).encode(), float(s)))
    return out


def _client(port: int, payloads: list[tuple[bytes, float]], clients: int, requests: int, q) -> None:
    import aiohttp

    async def main() -> None:
        lat: list[float] = []
        audio = 0.0
        errors = 0
        next_i = iter(range(requests))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as s:
            async def worker() -> None:
                nonlocal audio, errors
                for i in next_i:
                    body, dur = payloads[i % len(payloads)]
                    t0 = time.perf_counter()
                    async with s.post(f"http://127.0.0.1:{port}/invocations", data=body,
                                      headers={"Content-Type": "application/json"}) as r:
                        await r.read()
                        if r.status == 200:
                            lat.append(time.perf_counter() - t0)
                            audio += dur
                        else:
                            errors += 1
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(clients)))
            q.put((time.perf_counter() - t0, lat, audio, errors))

    asyncio.run(main())


def serve_and_measure(clients: int, requests: int, prep_processes: int, out_q) -> None:
    """In a fresh process: the worker's front over NullBackend; measure one load run."""
    sys.path.insert(0, str(HERE))
    from procs import proc_cpu_s
    from aiohttp import web

    from tideserve.metrics.triton import TritonMetrics
    from tideserve.spec.models import Decoding
    from tideserve.worker import backends
    from tideserve.worker.api import WorkerService, build_app
    from tideserve.worker.engine import EngineConfig
    from tideserve.worker.engine_client import EngineClient
    from tideserve.worker.prep import PrepPool

    backends.BACKENDS["null"] = "front_cpu:NullBackend"
    payloads = bodies()

    async def main() -> dict:
        metrics = TritonMetrics("whisper")
        engine = EngineClient(EngineConfig(backend="null", model_dir="", target=None, decoding=Decoding(),
                                           max_batch_size=64, max_queue_delay_s=0.001), on_stats=metrics.on_engine_stats)
        handoff = getattr(engine, "handoff", None)  # a tree before the handoff socket has none
        prep = PrepPool(prep_processes, handoff=handoff) if handoff else PrepPool(prep_processes)
        prep.start()
        await engine.start()
        service = WorkerService("whisper", prep, engine, metrics, 3600.0)
        service.state.ready = True
        runner = web.AppRunner(build_app(service, 64 << 20), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        try:
            for n in (min(requests, 200), requests):  # warm-up, then the measured run
                cl = ctx.Process(target=_client, args=(port, payloads, clients, n, q))
                others = [engine.process.pid, *prep.pids()]
                before = resource.getrusage(resource.RUSAGE_SELF)
                before_others = sum(proc_cpu_s(p) for p in others)
                cl.start()
                wall, lat, audio, errors = await asyncio.get_running_loop().run_in_executor(None, q.get)
                cl.join()
                after = resource.getrusage(resource.RUSAGE_SELF)
                after_others = sum(proc_cpu_s(p) for p in others)
            front_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            return {"clients": clients, "requests": len(lat), "errors": errors, "wall_s": wall,
                    "req_per_s": len(lat) / wall, "audio_s_per_s": audio / wall,
                    "front_ms_per_request": 1000 * front_s / max(1, len(lat)),
                    "front_cores": front_s / wall,
                    "prep_engine_ms_per_request": 1000 * (after_others - before_others) / max(1, len(lat)),
                    "p50_ms": 1000 * statistics.median(lat)}
        finally:
            await runner.cleanup()
            prep.close()
            engine.stop(5.0)

    out_q.put(asyncio.run(main()))


def run_tree(src: Path, args) -> dict:
    """One measured run of the tree whose package is under ``src`` (a fresh interpreter)."""
    code = (f"import sys, json, multiprocessing as mp; sys.path.insert(0, {str(src)!r}); "
            f"sys.path.insert(0, {str(HERE)!r}); import front_cpu; q = mp.get_context('spawn').SimpleQueue(); "
            f"front_cpu.serve_and_measure({args.clients}, {args.requests}, {args.prep_processes}, q); "
            "print(json.dumps(q.get()))")
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{HERE}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False,
                         cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise SystemExit(f"run in {src} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--prep-processes", type=int, default=2)
    ap.add_argument("--base", type=Path, help="another checkout to measure side by side (its src/)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trees = {"this": HERE.parent / "src"}
    if args.base:
        trees["base"] = args.base.resolve() / "src"
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    for r in range(args.rounds if args.base else 1):
        for name, src in trees.items():
            res = run_tree(src, args)
            runs[name].append(res)
            print(f"round {r + 1} {name:>4}: {res['req_per_s']:7.1f} req/s  {res['audio_s_per_s']:8.1f} audio-s/s  "
                  f"front {res['front_ms_per_request']:.2f} ms/req ({res['front_cores']:.2f} cores)  "
                  f"prep+engine {res['prep_engine_ms_per_request']:.2f} ms/req  p50 {res['p50_ms']:.0f} ms  "
                  f"errors {res['errors']}", flush=True)
    out: dict = {"clients": args.clients, "requests": args.requests, "prep_processes": args.prep_processes,
                 "cpu_count": os.cpu_count(), "runs": runs}
    if args.base:
        def med(name: str, key: str) -> float:
            return statistics.median(x[key] for x in runs[name])
        out["ratios_this_over_base"] = {k: med("this", k) / med("base", k)
                                        for k in ("req_per_s", "front_ms_per_request", "prep_engine_ms_per_request")}
        print("this/base (median of rounds):", json.dumps({k: round(v, 3) for k, v in out["ratios_this_over_base"].items()}))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
