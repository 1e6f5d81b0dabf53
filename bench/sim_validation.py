"""Validate the simulator against a real embedded endpoint on the same short trace.

Replays a short thinned trace (the committed report: the first 300 s of the Azure LLM 2023
conversation trace, thinned to 5%, about 100 requests; audio durations by the simulator's
duration rule) twice:

(a) the simulator (``tideserve.sim.simulate``, embedded mode, one machine with the local config's
    replica slots) with the CPU profile measured END TO END through the gateway
    (bench/profile_e2e.py: HTTP, body parsing, audio decoding, language identification and
    Whisper's follow-up rounds are in its service times; executions that run at once share the
    cores by the profile's busy_cores_per_window), over ``--sim-seeds`` seeds pooled (service
    times are drawn from the profile's samples);
(b) ``tideserve up`` of examples/whisper-tiny-en.yaml (port 0, a subprocess), each request sent at
    its trace time as a WAV of its assigned duration (pytest-audioeval speech, looped or trimmed),
    while /admin/status is polled every 0.5 s for the replica counts; ``--real-runs`` times, a
    fresh endpoint each, pooled (one run of the same command moved its p50 by up to 27%).

Prints each real run's figures, latency percentiles side by side with the error, the mean
latency by audio length on both sides, and the replica counts over time (ready
replicas per poll, sim vs real) with their mean absolute difference. Then a calibration: warm 5 s
requests on the speech of the profile's batch-1 5 s samples, one after another, whose median over
the profile's figure is this machine's slowdown against the profile (other jobs), and the simulated
percentiles times that factor. The machine's load average is printed before and after.

Run: PYTHONPATH=src .venv/bin/python bench/sim_validation.py --trace AzureLLMInferenceTrace_conv.csv \
         --max-trace-s 300 [--real-runs 3 --thin 0.05 --set batching.instances=1 --dump FILE]
Trace: Azure LLM inference trace 2023 (CC-BY-4.0), Patel et al., "Splitwise: Efficient generative
LLM inference using phase splitting", ISCA 2024.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import statistics
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


def cpu_times() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs from /proc/stat ((0, 0) where there is none): the time
    the hypervisor gave this VM's CPUs to others, which slows the real side and no load average shows."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


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
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=JSON",
                    help="override a spec key for both runs, e.g. batching.instances=1 (repeatable)")
    ap.add_argument("--sim-seeds", type=int, default=10, help="simulated runs (seeds 0..N-1), pooled")
    ap.add_argument("--real-runs", type=int, default=1, help="real replays (a fresh endpoint each), pooled")
    ap.add_argument("--dump", type=Path, help="write each request's arrival, audio and both latencies here (JSON)")
    args = ap.parse_args()
    overrides: dict = {}
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        if not (section and name and value):
            ap.error(f"--set {item!r}: expected SECTION.KEY=JSON, e.g. batching.instances=1")
        overrides.setdefault(section, {})[name] = json.loads(value)

    reqs = load_trace(args.trace, args.duration_rule, args.seed, args.thin, 1.0, args.max_trace_s)
    prof = load_profile(args.profile)
    speech = speech_samples()
    bodies = {r.id: {"audio_data": base64.b64encode(wav_bytes(clip_of(speech, r.audio_s, 1.3 * r.id))).decode()}
              for r in reqs}
    print(f"trace: {len(reqs)} requests over {reqs[-1].arrival_s:.0f} s, audio {min(r.audio_s for r in reqs):.1f}-"
          f"{max(r.audio_s for r in reqs):.1f} s (thin {args.thin:g}, first {args.max_trace_s:g} s, seed {args.seed})",
          flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        path = write_endpoint(Path(tmp), min_replicas=None, **overrides)
        spec = load_endpoint(path).spec
        five_point = next(p for p in next(x for x in prof.pools if x.target == spec.pools[0].target).points
                          if p.batch_size == 1 and p.audio_s == 5.0)
        sims = [simulate(spec, reqs, prof.pools, RunOptions(cluster="local", replica_slots=LocalConfig().replica_slots,
                                                            cpu_cores=prof.metadata.cpus or os.cpu_count() or 2, seed=seed))
                for seed in range(args.sim_seeds)]
        sim = sims[0]
        load_before = os.getloadavg()
        steal_before = cpu_times()
        # Each real run is a fresh endpoint (it starts from zero replicas, as the simulation does);
        # the runs' latencies are pooled, as the simulated seeds are: the real side moves between
        # runs of the same command on this machine (p50 1.32-1.68 s over six single runs).
        runs: list[dict[int, float]] = []
        polls: list[tuple[float, int, int]] = []
        warm: list[float] = []
        for k in range(args.real_runs):
            here = Path(tmp) / f"run{k + 1}"  # its own folder: `up` leaves its port file behind
            here.mkdir()
            with EndpointProcess(path, here) as ep:
                ep.wait_for(lambda s: s["zygote"] in ("ready", "off"), 60, "the zygote")
                lat, run_polls = asyncio.run(replay(ep.url, reqs, bodies))
                runs.append(lat)
                polls += run_polls
                # The speech of the profile's batch-1 5 s samples (bench/profile_e2e.py: offset 2.3 s x repeat).
                fives = [{"audio_data": base64.b64encode(wav_bytes(clip_of(speech, 5.0, 2.3 * rep))).decode()}
                         for rep in range(len(five_point.samples_s) or 1)]
                with ep.client(timeout=120) as c:
                    c.post("/invocations", json=fives[0]).raise_for_status()
                    for five in fives:
                        t = time.monotonic()
                        c.post("/invocations", json=five).raise_for_status()
                        warm.append(time.monotonic() - t)
        load_after = os.getloadavg()
        steal_after = cpu_times()

    # Service times are drawn from the profile's samples: the simulated side is every seed's
    # latencies pooled, and each request's mean over the seeds.
    sim_lat = [r.latency_s for x in sims for r in x.requests if r.latency_s is not None]
    sim_mean = {r.id: sum(x.requests[i].latency_s for x in sims) / len(sims) for i, r in enumerate(sim.requests)
                if all(x.requests[i].latency_s is not None for x in sims)}
    real = [lat[r.id] for lat in runs for r in reqs]
    real_lat = {r.id: sum(lat[r.id] for lat in runs) / len(runs) for r in reqs}  # each request's mean
    for k, lat in enumerate(runs):
        one = list(lat.values())
        print(f"real run {k + 1}: p50 {percentile(one, 50):.2f} s, p95 {percentile(one, 95):.2f} s, "
              f"mean {sum(one) / len(one):.2f} s")
    print(f"\nlatency (s; sim: {args.sim_seeds} seeds pooled; real: {len(runs)} run(s) pooled) "
          f"{'sim':>8} {'real':>8} {'error':>8} {'error %':>8}")
    for name, p in (("p50", 50), ("p95", 95), ("p99", 99)):
        s, r = percentile(sim_lat, p), percentile(real, p)
        print(f"  {name:<14} {s:8.2f} {r:8.2f} {s - r:+8.2f} {100 * (s - r) / r:+7.1f}%")
    ms, mr = sum(sim_lat) / len(sim_lat), sum(real) / len(real)
    print(f"  {'mean':<14} {ms:8.2f} {mr:8.2f} {ms - mr:+8.2f} {100 * (ms - mr) / mr:+7.1f}%")
    per = [abs(v - real_lat[i]) for i, v in sim_mean.items()]
    print(f"  per-request mean absolute error {sum(per) / len(per):.2f} s")
    print("\nby audio length (mean latency, s)      n      sim     real  error %")
    for lo, hi in ((0, 5), (5, 10), (10, 20), (20, 30.01)):
        ids = [r.id for r in reqs if lo <= r.audio_s < hi and r.id in sim_mean]
        if ids:
            s_m = sum(sim_mean[i] for i in ids) / len(ids)
            r_m = sum(real_lat[i] for i in ids) / len(ids)
            print(f"  {lo:>4g}-{min(hi, 30):<4g} s {len(ids):>24} {s_m:8.2f} {r_m:8.2f} {100 * (s_m - r_m) / r_m:+7.1f}%")

    profiled = five_point.latency_s
    factor = statistics.median(warm) / profiled
    print(f"\ncalibration: warm 5 s requests (the profile's speech) {statistics.median(warm):.2f} s here now vs "
          f"{profiled:.2f} s in the profile: "
          f"slowdown x{factor:.2f}; load average (1/5/15 min) before {load_before[0]:.1f}/{load_before[1]:.1f}/"
          f"{load_before[2]:.1f}, after {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f} on "
          f"{os.cpu_count()} CPUs; CPU time stolen by the hypervisor during the real runs "
          f"{100 * (steal_after[0] - steal_before[0]) / max(1, steal_after[1] - steal_before[1]):.1f}%")
    for name, p in (("p50", 50), ("p95", 95), ("p99", 99)):
        s, r = factor * percentile(sim_lat, p), percentile(real, p)
        print(f"  sim x{factor:.2f} {name:<6} {s:8.2f} {r:8.2f} {s - r:+8.2f} {100 * (s - r) / r:+7.1f}%")

    if args.dump:
        args.dump.write_text(json.dumps([{"id": r.id, "arrival_s": round(r.arrival_s, 3), "audio_s": round(r.audio_s, 2),
                                          "sim_mean_s": sim_mean.get(r.id), "real_s": round(real_lat[r.id], 3),
                                        "real_runs_s": [round(lat[r.id], 3) for lat in runs]} for r in reqs],
                                        indent=1))

    tl = sim.timeline

    def sim_ready(t: float) -> int:
        k = max((i for i, x in enumerate(tl) if x[0] <= t), default=0)
        return sum(tl[k][2].values())

    diffs = [abs(sim_ready(t) - ready) for t, ready, _ in polls]
    print(f"\nready replicas over time (polled every 0.5 s, {len(polls)} polls): mean sim "
          f"{sum(sim_ready(t) for t, _, _ in polls) / len(polls):.2f} vs real {sum(x[1] for x in polls) / len(polls):.2f}; "
          f"max sim {max(sim_ready(t) for t, _, _ in polls)} vs real {max(x[1] for x in polls)}; "
          f"mean |sim - real| {sum(diffs) / len(diffs):.2f}; polls equal {100 * sum(d == 0 for d in diffs) / len(diffs):.0f}%")
    first = polls[: next((i for i in range(1, len(polls)) if polls[i][0] < polls[i - 1][0]), len(polls))]
    print("  the first real run:")
    polls = first  # the runs' polls follow one another; each starts again at t = 0
    step = max(1, len(polls) // 12)
    print("  t (s):   " + " ".join(f"{polls[i][0]:5.0f}" for i in range(0, len(polls), step)))
    print("  sim:     " + " ".join(f"{sim_ready(polls[i][0]):5d}" for i in range(0, len(polls), step)))
    print("  real:    " + " ".join(f"{polls[i][1]:5d}" for i in range(0, len(polls), step)))


if __name__ == "__main__":
    main()
