"""Validate the simulator against a real embedded endpoint on the same short trace.

Replays a SHORT thinned trace (default: the first 120 s of the Azure LLM 2023 conversation trace,
thinned to 5%, a few dozen requests; audio durations by the simulator's duration rule) twice:

(a) the simulator (``tideserve.sim.simulate``, embedded mode, one machine with the local config's
    replica slots) with the measured CPU profile;
(b) ``tideserve up`` of examples/whisper-tiny-en.yaml (port 0, a subprocess), each request sent at
    its trace time as a WAV of its assigned duration (pytest-audioeval speech, looped or trimmed),
    while /admin/status is polled every 0.5 s for the replica counts.

Prints latency percentiles side by side with the error, and the replica counts over time (ready
replicas per poll, sim vs real) with their mean absolute difference. Then a calibration: three
sequential warm 5 s requests against the same endpoint, whose median over the profile's batch-1
5 s figure is this machine's slowdown during the run (other jobs, HTTP and audio decoding), and the
simulated percentiles times that factor. The machine's load average is printed before and after.

Run: PYTHONPATH=src .venv/bin/python bench/sim_validation.py [--thin 0.05 --max-trace-s 120]
Trace: Azure LLM inference trace 2023 (CC-BY-4.0), Patel et al., "Splitwise: Efficient generative
LLM inference using phase splitting", ISCA 2024.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import sys
import tempfile
import time
import wave
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from endpoint import EndpointProcess, write_endpoint  # noqa: E402

from tideserve.cli.bench import clip_of, speech_samples  # noqa: E402
from tideserve.sim import RunOptions, load_profile, load_trace, percentile, simulate  # noqa: E402
from tideserve.spec import LocalConfig, load_endpoint  # noqa: E402


def wav_bytes(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


async def replay(url: str, reqs, bodies, status_every_s: float = 0.5):
    lat: dict[int, float] = {}
    polls: list[tuple[float, int, int]] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        t0 = time.monotonic()

        async def one(r) -> None:
            await asyncio.sleep(max(0.0, t0 + r.arrival_s - time.monotonic()))
            t = time.monotonic()
            resp = await c.post("/invocations", json=bodies[r.id])
            resp.raise_for_status()
            lat[r.id] = time.monotonic() - t

        async def poll() -> None:
            while True:
                st = (await c.get("/admin/status")).json()
                ready = sum(p["ready"] for p in st["pools"])
                total = sum(len(p["replicas"]) for p in st["pools"])
                polls.append((time.monotonic() - t0, ready, total))
                await asyncio.sleep(status_every_s)

        poller = asyncio.create_task(poll())
        await asyncio.gather(*(one(r) for r in reqs))
        await asyncio.sleep(status_every_s * 2)
        poller.cancel()
    return lat, polls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", required=True,
                    help="trace CSV; the committed results used the Azure LLM conversation trace 2023 "
                         "(AzureLLMInferenceTrace_conv.csv, github.com/Azure/AzurePublicDataset)")
    ap.add_argument("--profile", default=str(ROOT / "bench" / "profiles" / "cpu-2core-tiny-en.json"))
    ap.add_argument("--thin", type=float, default=0.05)
    ap.add_argument("--max-trace-s", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--duration-rule", default="quantile:ContextTokens:1:30")
    args = ap.parse_args()

    reqs = load_trace(args.trace, args.duration_rule, args.seed, args.thin, 1.0, args.max_trace_s)
    prof = load_profile(args.profile)
    speech = speech_samples()
    bodies = {r.id: {"audio_data": base64.b64encode(wav_bytes(clip_of(speech, r.audio_s, 1.3 * r.id))).decode()}
              for r in reqs}
    print(f"trace: {len(reqs)} requests over {reqs[-1].arrival_s:.0f} s, audio {min(r.audio_s for r in reqs):.1f}-"
          f"{max(r.audio_s for r in reqs):.1f} s (thin {args.thin:g}, first {args.max_trace_s:g} s, seed {args.seed})",
          flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        path = write_endpoint(Path(tmp), min_replicas=None)
        spec = load_endpoint(path).spec
        sim = simulate(spec, reqs, prof.pools, RunOptions(cluster="local", replica_slots=LocalConfig().replica_slots))
        load_before = os.getloadavg()
        with EndpointProcess(path, Path(tmp)) as ep:
            ep.wait_for(lambda s: s["zygote"] in ("ready", "off"), 60, "the zygote")
            real_lat, polls = asyncio.run(replay(ep.url, reqs, bodies))
            five = {"audio_data": base64.b64encode(wav_bytes(clip_of(speech, 5.0))).decode()}
            with ep.client(timeout=120) as c:
                c.post("/invocations", json=five).raise_for_status()
                warm = []
                for _ in range(3):
                    t = time.monotonic()
                    c.post("/invocations", json=five).raise_for_status()
                    warm.append(time.monotonic() - t)
        load_after = os.getloadavg()

    sim_lat = [r.latency_s for r in sim.requests if r.latency_s is not None]
    real = [real_lat[r.id] for r in reqs]
    print(f"\nlatency (s)      {'sim':>8} {'real':>8} {'error':>8} {'error %':>8}")
    for name, p in (("p50", 50), ("p95", 95), ("p99", 99)):
        s, r = percentile(sim_lat, p), percentile(real, p)
        print(f"  {name:<14} {s:8.2f} {r:8.2f} {s - r:+8.2f} {100 * (s - r) / r:+7.1f}%")
    ms, mr = sum(sim_lat) / len(sim_lat), sum(real) / len(real)
    print(f"  {'mean':<14} {ms:8.2f} {mr:8.2f} {ms - mr:+8.2f} {100 * (ms - mr) / mr:+7.1f}%")
    per = [abs(s.latency_s - real_lat[s.id]) for s in sim.requests if s.latency_s is not None]
    print(f"  per-request mean absolute error {sum(per) / len(per):.2f} s")

    profiled = next(p for p in prof.pools if p.target == spec.pools[0].target).service_time_s(1, 5.0)
    factor = sorted(warm)[1] / profiled
    print(f"\ncalibration: warm 5 s request {sorted(warm)[1]:.2f} s here now vs {profiled:.2f} s in the profile: "
          f"slowdown x{factor:.2f}; load average (1/5/15 min) before {load_before[0]:.1f}/{load_before[1]:.1f}/"
          f"{load_before[2]:.1f}, after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f} on "
          f"{os.cpu_count()} CPUs")
    for name, p in (("p50", 50), ("p95", 95), ("p99", 99)):
        s, r = factor * percentile(sim_lat, p), percentile(real, p)
        print(f"  sim x{factor:.2f} {name:<6} {s:8.2f} {r:8.2f} {s - r:+8.2f} {100 * (s - r) / r:+7.1f}%")

    tl = sim.timeline

    def sim_ready(t: float) -> int:
        k = max((i for i, x in enumerate(tl) if x[0] <= t), default=0)
        return sum(tl[k][2].values())

    diffs = [abs(sim_ready(t) - ready) for t, ready, _ in polls]
    print(f"\nready replicas over time (polled every 0.5 s, {len(polls)} polls): mean sim "
          f"{sum(sim_ready(t) for t, _, _ in polls) / len(polls):.2f} vs real {sum(x[1] for x in polls) / len(polls):.2f}; "
          f"max sim {max(sim_ready(t) for t, _, _ in polls)} vs real {max(x[1] for x in polls)}; "
          f"mean |sim - real| {sum(diffs) / len(diffs):.2f}; polls equal {100 * sum(d == 0 for d in diffs) / len(diffs):.0f}%")
    step = max(1, len(polls) // 12)
    print("  t (s):   " + " ".join(f"{polls[i][0]:5.0f}" for i in range(0, len(polls), step)))
    print("  sim:     " + " ".join(f"{sim_ready(polls[i][0]):5d}" for i in range(0, len(polls), step)))
    print("  real:    " + " ".join(f"{polls[i][1]:5d}" for i in range(0, len(polls), step)))


if __name__ == "__main__":
    main()
