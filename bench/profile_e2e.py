"""Measure a service-time profile END TO END: through the gateway of a real `tideserve up`.

`tideserve bench profile` times one execution of the backend in-process (features, encoder,
decoding). A request served for real also crosses HTTP, has its body parsed and its audio decoded
in a prep process, is identified (``model.language_id``), may take Whisper's follow-up rounds
(a seek to an unfinished tail, a temperature fallback) and is answered through the gateway. This
script measures all of that, in the same profile format (``tideserve.profile/v1``) so that the
simulator (``tideserve simulate``, ``bench/sim_validation.py``) replays with it:

for each batch size b, the default example is started with ONE replica of ONE model instance
and ``max_batch_size: b`` (the spec's own ``max_queue_delay_ms``), so that b requests sent at
once form one batch (cut when the b-th reaches the engine); each point is the wall time from
sending b requests of ``audio_s`` seconds of speech (pytest-audioeval speech looped to length,
as the in-process profile and the validation use) to the last answer, each repeat on other speech (offsets into the looped
speech). The follow-up rounds of those windows run as they do in service (the spec's queue delay).

Then ``--busy-cores`` measures, per pool, the cores one window of an execution keeps busy (the
simulator's sharing of a machine between executions that run at once: see ``tideserve.sim.engine``).

Run (a quiet machine; the load average is recorded before and after):
  PYTHONPATH=src .venv/bin/python bench/profile_e2e.py --repeats 5 --pool cpu-int8=cpu-x86_64-int8 \
      --pool cpu-fp32=cpu-x86_64-fp32 --out bench/profiles/cpu-2core-tiny-en.json
  PYTHONPATH=src .venv/bin/python bench/profile_e2e.py --busy-cores --out bench/profiles/cpu-2core-tiny-en.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from endpoint import EndpointProcess, write_endpoint  # noqa: E402
from sim_validation import wav_bytes  # noqa: E402

from tideserve.cli.bench import SAMPLE_RATE, _cpu_model, clip_of, speech_samples  # noqa: E402
from tideserve.cli.engines import backend_version  # noqa: E402
from tideserve.sim.profile import Profile, ProfileMetadata, PoolProfile, ProfilePoint, load_profile  # noqa: E402
from tideserve.spec import load_endpoint  # noqa: E402


async def one_batch(url: str, bodies: list[dict]) -> float:
    """Seconds from sending ``bodies`` at once to the last answer."""
    return max(await each_latency(url, bodies))


def endpoint_for(here: Path, name: str, target: str, **batching) -> Path:
    """The default example with one pool ``name`` of ``target``, one replica, ``batching`` keys."""
    here.mkdir()
    path = write_endpoint(here, min_replicas=1, batching=batching)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["pools"][0].update(name=name, target=target)
    path.write_text(yaml.safe_dump(doc))
    return path


def busy_cores_per_window(url: str, speech, cores: int, threads: int, repeats: int = 3) -> float:
    """Cores one batch-1 execution keeps busy, from k lone 15 s requests at once on k instances
    against the same requests one by one: under processor sharing each takes
    max(1, k x c / cores) times as long, so c = cores x ratio / k where k x threads oversubscribes
    the cores (k = 3, 4 here); the mean over k, at most ``threads``."""
    bodies = [[{"audio_data": base64.b64encode(wav_bytes(clip_of(speech, 15.0, 1.7 * i + 2.3 * rep))).decode()}
               for i in range(4)] for rep in range(repeats)]
    alone = [[asyncio.run(one_batch(url, [b])) for b in row] for row in bodies]
    fits = []
    for k in (3, 4):
        at_once = [asyncio.run(each_latency(url, row[:k])) for row in bodies]
        ratio = statistics.mean(x for row in at_once for x in row) / statistics.mean(x for row in alone for x in row[:k])
        fits.append(cores * ratio / k)
        print(f"  {k} lone requests at once: {ratio:.2f}x alone -> {fits[-1]:.2f} cores each", flush=True)
    return min(float(threads), statistics.mean(fits))


async def each_latency(url: str, bodies: list[dict]) -> list[float]:
    """Each request's seconds, all sent at once."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        async def one(b: dict) -> float:
            t = time.perf_counter()
            (await c.post("/invocations", json=b)).raise_for_status()
            return time.perf_counter() - t
        return list(await asyncio.gather(*(one(b) for b in bodies)))


def add_busy_cores(path: Path) -> None:
    """Measure ``busy_cores_per_window`` for each pool of the profile at ``path`` and write it in."""
    from tideserve.worker.cores import intra_op_threads, usable_cores

    prof = load_profile(path)
    speech = speech_samples()
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        for pool in prof.pools:
            here = Path(tmp) / pool.pool
            with EndpointProcess(endpoint_for(here, pool.pool, pool.target, max_batch_size=1, instances=4), here) as ep:
                asyncio.run(one_batch(ep.url, [{"audio_data": base64.b64encode(wav_bytes(clip_of(speech, 5.0))).decode()}]))
                pool.busy_cores_per_window = round(busy_cores_per_window(ep.url, speech, cores, intra_op_threads(cores)), 3)
            print(f"{pool.pool}: busy_cores_per_window {pool.busy_cores_per_window}", flush=True)
    prof.metadata.notes += ("; busy_cores_per_window: lone 15 s requests 3 and 4 at once on 4 instances against "
                            "one by one (bench/profile_e2e.py --busy-cores)")
    path.write_text(json.dumps(prof.model_dump(exclude_none=True), indent=1) + "\n")
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--audio-s", default="5,15,30")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pool", action="append", metavar="NAME=TARGET",
                    help="a pool to measure, as the example's pool with this name and target (repeatable; "
                         "default cpu-int8=cpu-x86_64-int8)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--busy-cores", action="store_true",
                    help="only measure busy_cores_per_window for each pool of the profile --out and write it in")
    args = ap.parse_args()
    if args.busy_cores:
        add_busy_cores(args.out)
        return
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    lengths = [float(x) for x in args.audio_s.split(",")]
    speech = speech_samples()
    load_before = os.getloadavg()[0]
    pools = []
    with tempfile.TemporaryDirectory() as tmp:
        for item in args.pool or ["cpu-int8=cpu-x86_64-int8"]:
            name, _, target = item.partition("=")
            points = []
            for b in batch_sizes:
                here = Path(tmp) / f"{name}-{b}"  # one folder per endpoint run (its log names its port)
                path = endpoint_for(here, name, target, max_batch_size=b, instances=1)
                spec = load_endpoint(path).spec
                with EndpointProcess(path, here) as ep:
                    warm = {"audio_data": base64.b64encode(wav_bytes(clip_of(speech, 5.0))).decode()}
                    asyncio.run(one_batch(ep.url, [warm]))
                    for audio_s in lengths:
                        # Each repeat on other speech (a window's decode time depends on what it
                        # says: single 15 s windows took 1.1-4.2 s here by where the loop starts),
                        # the starts spread evenly over the looped speech (7 s of clips by default:
                        # steps of 2.3 s nearly repeat every third, so 15 repeats sampled 3 places).
                        step = len(speech) / SAMPLE_RATE / args.repeats
                        samples = [asyncio.run(one_batch(ep.url, [
                            {"audio_data": base64.b64encode(wav_bytes(clip_of(speech, audio_s, 1.7 * k + step * rep))).decode()}
                            for k in range(b)])) for rep in range(args.repeats)]
                        points.append(ProfilePoint(batch_size=b, audio_s=audio_s, latency_s=statistics.median(samples),
                                                   samples_s=[round(s, 4) for s in samples]))
                        print(f"{name} ({target}): batch {b} x {audio_s:g} s -> {points[-1].latency_s:.3f} s "
                              f"{points[-1].samples_s}", flush=True)
            points.sort(key=lambda p: (p.audio_s, p.batch_size))
            pools.append(PoolProfile(pool=name, target=target, accelerator="cpu", points=points))
    meta = ProfileMetadata(
        machine=socket.gethostname(), cpu=_cpu_model(), cpus=os.cpu_count() or 0, gpu=None,
        date=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(), model=spec.model.name,
        model_source=spec.model.source, backend=spec.model.backend, backend_version=backend_version(spec.model.backend),
        decoding=spec.model.decoding.model_dump(), repeats=args.repeats, measured=True,
        load_average_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        notes="END TO END through the gateway of `tideserve up` (bench/profile_e2e.py): b requests sent at once "
              "to one replica of one model instance with max_batch_size b, from the first send to the last "
              "answer; includes HTTP, body parsing, audio decoding, language identification "
              f"({'on' if spec.model.language_id else 'off'}) and Whisper's follow-up rounds; speech looped to length",
    )
    prof = Profile(metadata=meta, pools=pools)
    args.out.write_text(json.dumps(prof.model_dump(exclude_none=True), indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
