"""Gateway overhead and batching benefit, measured side by side in one run.

(a1) faster-whisper's own ``WhisperModel.transcribe`` in this process, 8 client threads;
(a2) tideserve's worker pipeline without HTTP (prep processes, engine process: decode, windows,
     batching, backend), 8 concurrent callers;
(b)  the same clips through ``tideserve up``: client -> gateway -> worker over HTTP,
     8 concurrent clients.
Same model (tiny.en int8 on CPU) and decoding (the example endpoint's beam 5, timestamps).
Prints throughput ratios b/a and the added p50 latency. Then worker throughput with
max_batch_size 8 vs 1 at concurrency 16 through the gateway.

Run: ``make bench`` (or ``.venv/bin/python bench/gateway_overhead.py --requests 48``).
Absolute numbers depend on the machine (2 noisy cores here); the ratios are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from endpoint import EndpointProcess, write_endpoint  # noqa: E402

from tideserve.metrics.triton import TritonMetrics  # noqa: E402
from tideserve.sources import resolve_source  # noqa: E402
from tideserve.spec import load_endpoint  # noqa: E402
from tideserve.worker.api import WorkerService  # noqa: E402
from tideserve.worker.engine import EngineConfig  # noqa: E402
from tideserve.worker.engine_client import EngineClient  # noqa: E402
from tideserve.worker.prep import PrepPool, default_processes, prepare_invocation  # noqa: E402


def clips() -> list[bytes]:
    import pytest_audioeval

    d = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "en"
    return [p.read_bytes() for p in sorted(d.glob("*.wav"))]


def summary(name: str, lat: list[float], wall: float) -> dict:
    lat = sorted(lat)
    r = {"name": name, "n": len(lat), "rps": len(lat) / wall, "p50_ms": 1000 * statistics.median(lat),
         "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}
    print(f"  {name:<44} {r['rps']:6.2f} req/s   p50 {r['p50_ms']:7.1f} ms   p99 {r['p99_ms']:7.1f} ms   (n={r['n']})", flush=True)
    return r


def run_faster_whisper(audio: list[bytes], n: int, concurrency: int) -> dict:
    import io

    from faster_whisper import WhisperModel, decode_audio

    ep = load_endpoint(ROOT / "examples" / "whisper-tiny-en.yaml")
    dec = ep.spec.model.decoding
    model = WhisperModel(str(resolve_source(ep.spec.model.source)), device="cpu", compute_type="int8", num_workers=1)

    def one(i: int) -> float:
        t = time.perf_counter()
        samples = decode_audio(io.BytesIO(audio[i % len(audio)]))
        segs, _ = model.transcribe(samples, beam_size=dec.beam_size, without_timestamps=dec.without_timestamps is not False,
                                   temperature=0.0, condition_on_previous_text=False)
        "".join(s.text for s in segs)
        return time.perf_counter() - t

    one(0)  # warm-up
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        lat = list(pool.map(one, range(n)))
    return summary("(a1) in-process faster-whisper transcribe", lat, time.perf_counter() - t0)


def run_service(audio: list[bytes], n: int, concurrency: int, max_batch_size: int) -> dict:
    """The worker's own pipeline without HTTP: prep processes (parse, decode) and the engine
    process (batching, model), as ``tideserve worker`` builds them."""
    ep = load_endpoint(ROOT / "examples" / "whisper-tiny-en.yaml")
    spec = ep.spec
    pool = spec.pools[0]
    bodies = [json.dumps({"audio_data": base64.b64encode(a).decode(), "whisper_prompt": ""}).encode() for a in audio]

    async def main() -> dict:
        metrics = TritonMetrics(spec.model.name)
        engine = EngineClient(EngineConfig(
            backend=spec.model.backend, model_dir=str(resolve_source(spec.model.source)), target=pool.parsed_target,
            decoding=spec.model.decoding, max_batch_size=max_batch_size,
            max_queue_delay_s=spec.batching.max_queue_delay_ms / 1000.0, cpu_threads=0), on_stats=metrics.on_engine_stats)
        prep = PrepPool(default_processes())
        prep.start()
        await engine.start()
        svc = WorkerService(spec.model.name, prep, engine, metrics)
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> float:
            async with sem:
                t = time.perf_counter()
                prepared = await svc.prepare(prepare_invocation, bodies[i % len(bodies)], None)
                await svc.transcribe(prepared)
                return time.perf_counter() - t

        try:
            await one(0)
            t0 = time.perf_counter()
            lat = await asyncio.gather(*(one(i) for i in range(n)))
            wall = time.perf_counter() - t0
        finally:
            prep.close()
            engine.stop(5.0)
        return summary(f"(a2) in-process tideserve worker service, bs {max_batch_size}", list(lat), wall)

    return asyncio.run(main())


def run_http(url: str, audio: list[bytes], n: int, concurrency: int, name: str) -> dict:
    bodies = [{"audio_data": base64.b64encode(a).decode(), "whisper_prompt": ""} for a in audio]

    async def main() -> dict:
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=concurrency)) as c:
            async def one(i: int) -> float:
                async with sem:
                    t = time.perf_counter()
                    r = await c.post("/invocations", json=bodies[i % len(bodies)])
                    r.raise_for_status()
                    return time.perf_counter() - t

            await one(0)
            t0 = time.perf_counter()
            lat = await asyncio.gather(*(one(i) for i in range(n)))
            return summary(name, list(lat), time.perf_counter() - t0)

    return asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=48, help="requests per configuration")
    args = ap.parse_args()
    audio = clips()
    n = args.requests
    print(f"gateway overhead: {n} requests per configuration, {len(audio)} clips, concurrency 8", flush=True)
    # (a2) first: its engine process is forked, which must happen before this process has
    # loaded a model (CTranslate2's threads do not survive a fork).
    a2 = run_service(audio, n, 8, 8)
    a1 = run_faster_whisper(audio, n, 8)
    with tempfile.TemporaryDirectory() as tmp, EndpointProcess(write_endpoint(Path(tmp)), Path(tmp)) as ep:
        b = run_http(ep.url, audio, n, 8, "(b) client -> gateway -> worker (HTTP)")
    print(f"  throughput ratio b/a1: {b['rps'] / a1['rps']:.3f}   b/a2: {b['rps'] / a2['rps']:.3f}   (goal >= 0.95)")
    print(f"  added p50 latency b - a2: {b['p50_ms'] - a2['p50_ms']:+.1f} ms   b - a1: {b['p50_ms'] - a1['p50_ms']:+.1f} ms")

    print("\nbatching: worker throughput through the gateway at concurrency 16", flush=True)
    res = {}
    for bs in (8, 1):
        with tempfile.TemporaryDirectory() as tmp:
            path = write_endpoint(Path(tmp), batching={"max_batch_size": bs, "max_queue_delay_ms": 20},
                                  pools=[{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8",
                                          "replicas": {"min": 1, "max": 1}, "max_concurrency": 16}])
            with EndpointProcess(path, Path(tmp)) as ep:
                res[bs] = run_http(ep.url, audio, n, 16, f"max_batch_size={bs}")
    print(f"  batched / unbatched throughput: {res[8]['rps'] / res[1]['rps']:.3f}")


if __name__ == "__main__":
    main()
