"""Short requests while a long file is transcribed (issue 13, fairness): the p50 latency of a
short clip, sent one after another, on an idle replica (before and after), and while one long
file (built from the shipped clips with quiet gaps, as bench/accuracy.py does) is transcribed by
the same replica; the ratio of the p50 during to the p50 idle, per run; then the long file
again with nothing beside it (``long_file_alone_s``). Settings of
``batching.background_nice`` take turns over ``--rounds``. Not part of CI (minutes).

    .venv/bin/python bench/fairness.py --minutes 20 --background-nice 10,0 --rounds 3 \
        --json bench/results/fairness.json

Serves examples/whisper-tiny-en.yaml with one replica on ``--port``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from longfiles import long_file, wav_pcm16
from procs import stop

ROOT = Path(__file__).resolve().parents[1]


def clips() -> list:
    import pytest_audioeval

    sys.path.insert(0, str(ROOT / "src"))
    from tideserve.worker.audio import decode_audio

    d = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "en"

    class Clip:
        def __init__(self, p: Path) -> None:
            self.samples, self.reference, self.wav = decode_audio(p.read_bytes()), p.stem, p.read_bytes()

    return [Clip(p) for p in sorted(d.glob("*.wav"))]


def measure(args: argparse.Namespace, nice: int | None, cs: list, long_wav: bytes) -> dict:
    """One served run: a replica with ``batching.background_nice`` = ``nice`` (None: the spec's
    default), the short clip's latencies idle before, during and idle after the long file."""
    tmp = Path(tempfile.mkdtemp(prefix="tideserve-fair-"))
    doc = yaml.safe_load((ROOT / "examples" / "whisper-tiny-en.yaml").read_text())
    doc["spec"]["pools"][0]["replicas"] = {"min": 1, "max": 1}
    # A 20-minute 16-bit WAV is 38 MB: past the default max_body_bytes (25 MiB), so raised here.
    doc["spec"]["gateway"].update(port=args.port, request_timeout_s=3600, hold_timeout_s=3600,
                                  max_body_bytes=128 * 1024 * 1024)
    if args.instances:
        doc["spec"]["batching"]["instances"] = args.instances
    if nice is not None:
        doc["spec"]["batching"]["background_nice"] = nice
    (tmp / "ep.yaml").write_text(yaml.safe_dump(doc))
    (tmp / "local.yaml").write_text(yaml.safe_dump({"cache_dir": str(tmp / "cache"),
                                                   "cpu_threads_per_replica": args.cpu_threads}))
    short = next(c for c in cs if c.reference == "hello_world").wav
    url = f"http://127.0.0.1:{args.port}"
    with open(tmp / "up.log", "w") as log:
        up = subprocess.Popen([str(ROOT / ".venv" / "bin" / "tideserve"), "up", str(tmp / "ep.yaml"), "--config",
                               str(tmp / "local.yaml"), "--log-format", "text"], stdout=log, stderr=subprocess.STDOUT)
    try:
        client = httpx.Client(base_url=url, timeout=3600)

        def one(wav: bytes) -> float:
            t = time.perf_counter()
            r = client.post("/invocations", content=wav, headers={"Content-Type": "audio/wav"})
            assert r.status_code == 200, r.text
            return time.perf_counter() - t

        deadline = time.monotonic() + 120
        while True:
            try:
                one(short)
                break
            except (httpx.HTTPError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        for _ in range(3):
            one(short)
        if args.alone_only:
            t = time.perf_counter()
            r = client.post("/invocations", content=long_wav, headers={"Content-Type": "audio/wav"})
            assert r.status_code == 200, r.text
            return {"background_nice": "default" if nice is None else nice, "long_file_min": args.minutes,
                    "long_file_alone_s": round(time.perf_counter() - t, 1)}
        idle = [one(short) for _ in range(args.probes)]
        long_done: dict = {}

        def run_long() -> None:
            c = httpx.Client(base_url=url, timeout=3600)
            t = time.perf_counter()
            r = c.post("/invocations", content=long_wav, headers={"Content-Type": "audio/wav"})
            long_done.update(status=r.status_code, seconds=time.perf_counter() - t)

        th = threading.Thread(target=run_long)
        th.start()
        time.sleep(1.0)  # the long file is decoded and its windows queued
        during = []
        while th.is_alive():
            during.append(one(short))
        th.join()
        if long_done.get("status") != 200:
            raise SystemExit(f"the long file was answered {long_done.get('status')}; see {tmp / 'up.log'}")
        after = [one(short) for _ in range(args.probes)]
        t = time.perf_counter()
        r = client.post("/invocations", content=long_wav, headers={"Content-Type": "audio/wav"})
        assert r.status_code == 200, r.text
        alone_s = time.perf_counter() - t
        # The idle p50 from the probes before and after together, so the host's drift over the
        # run falls on both sides of the ratio.
        idle_p50 = statistics.median(idle + after)
        return {
            "background_nice": "default" if nice is None else nice,
            "long_file_min": args.minutes, "long_file_status": long_done.get("status"),
            "long_file_s": round(long_done.get("seconds", 0), 1),
            "long_file_alone_s": round(alone_s, 1),
            "instances": args.instances or "default", "cpu_threads": args.cpu_threads,
            "short_clip": "hello_world.wav (1.1 s)", "short_idle_n": len(idle) + len(after),
            "short_during_n": len(during),
            "short_p50_idle_before_s": round(statistics.median(idle), 3),
            "short_p50_idle_after_s": round(statistics.median(after), 3),
            "short_p50_idle_s": round(idle_p50, 3),
            "short_p50_during_s": round(statistics.median(during), 3) if during else None,
            "short_p99_during_s": round(sorted(during)[max(0, math.ceil(0.99 * len(during)) - 1)], 3) if during else None,
            "short_max_during_s": round(max(during), 3) if during else None,
            "ratio_p50_during_to_idle": round(statistics.median(during) / idle_p50, 2) if during else None,
        }
    finally:
        stop(up)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--port", type=int, default=18396)
    ap.add_argument("--probes", type=int, default=20, help="short requests measured idle, before and after")
    ap.add_argument("--instances", type=int, help="batching.instances (default: the spec's default)")
    ap.add_argument("--cpu-threads", type=int, default=0, help="cpu_threads_per_replica (0: the backend's default)")
    ap.add_argument("--background-nice", default="",
                    help="batching.background_nice values taking turns, e.g. 10,0 (default: the spec's default)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each setting, taking turns")
    ap.add_argument("--alone-only", action="store_true", help="only the long file's time with nothing beside it")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    settings: list[int | None] = [int(x) for x in args.background_nice.split(",") if x] or [None]
    cs = clips()
    samples, _ = long_file(cs, args.minutes, seed=3)
    long_wav = wav_pcm16(samples)
    runs = []
    for r in range(args.rounds):
        for nice in settings if r % 2 == 0 else list(reversed(settings)):
            run = measure(args, nice, cs, long_wav)
            print(json.dumps(run), flush=True)
            runs.append(run)
    key = "long_file_alone_s" if args.alone_only else "ratio_p50_during_to_idle"
    out = {
        "command": "python bench/fairness.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "goal_ratio": 2.0, "runs": runs,
        "median_" + key: {str(r["background_nice"]): statistics.median(
            x[key] for x in runs if x["background_nice"] == r["background_nice"]) for r in runs},
    }
    print(json.dumps(out["median_" + key]))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
