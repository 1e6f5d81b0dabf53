"""Memory of one replica under concurrent requests at ``max_audio_s`` against its documented
budget (issue 15). Not part of CI (minutes of CPU).

    .venv/bin/python bench/memory_budget.py --clients 8 --json bench/results/memory_budget.json

Serves examples/whisper-tiny-en.yaml with one replica (``max_audio_s`` as given, default 3600,
and ``max_audio_s_in_flight`` left at its default, 2 x ``max_audio_s``), then sends ``--clients``
requests at once, each a FLAC file exactly ``max_audio_s`` long (one shipped speech clip, then
digital silence: the small-upload, long-audio case the issue found at 2.46 GB). A client that
gets 503 waits its Retry-After and sends again, as a well-behaved client does. Meanwhile the
resident memory (VmRSS, /proc) of every process of the replica (its HTTP front, engine and prep
processes: the descendants of ``tideserve up``, the gateway itself excluded and shown apart) is
sampled every 50 ms.

The budget (README, "Limits"; int16 PCM is 1.92 MB per audio minute): audio a replica holds is
kept once, in the engine (prep processes hand it there; the HTTP front holds none), about 2 MB
per audio minute, over at most ``max_audio_s_in_flight``; a file being decoded in a prep process
is there as its buffer and the pickled copy sent to the engine, and a file in transit as the
engine's received copy beside its array: about 6 MB per audio minute, once per prep process and
once in transit:

    budget_MB = 2 x in_flight_min + 6 x max_audio_min x (n_prep + 1)

The verdict compares the peak increase of the replica's summed RSS over its idle RSS with that
budget; ``mb_per_admitted_audio_min`` divides the peak increase by ``max_audio_s_in_flight`` in
minutes (the issue's example budget: 12 MB per audio minute).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import stop

ROOT = Path(__file__).resolve().parents[1]
SR = 16_000


def flac(samples: np.ndarray) -> bytes:
    """16 kHz mono int16 ``samples`` as a FLAC file (PyAV)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="flac") as out:
        st = out.add_stream("flac", rate=SR, layout="mono")
        for i in range(0, len(samples), SR * 10):
            part = samples[i:i + SR * 10].reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(part, format="s16", layout="mono")
            frame.sample_rate = SR
            for pkt in st.encode(frame):
                out.mux(pkt)
        for pkt in st.encode(None):
            out.mux(pkt)
    return buf.getvalue()


def long_audio(seconds: float) -> bytes:
    import pytest_audioeval

    clip = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "en" / "hello_world.wav"
    sys.path.insert(0, str(ROOT / "src"))
    from tideserve.worker.audio import decode_pcm16

    speech = decode_pcm16(clip.read_bytes())
    x = np.zeros(int(seconds * SR), np.int16)
    x[:len(speech)] = speech
    return flac(x)


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    """``field`` of /proc/PID/status in kB (VmRSS: resident now; VmHWM: peak resident)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for t in Path(f"/proc/{p}/task").iterdir()
                    for c in (t / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            kids = []
        out += kids
        todo += kids
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


class Sampler(threading.Thread):
    """Samples the replica's total RSS (sum over the descendants of ``root``) every ``period_s``."""

    def __init__(self, root: int, period_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.period_s = root, period_s
        self.peak_kb, self.peak_gateway_kb, self.peak_at_s, self.stop = 0, 0, 0.0, threading.Event()
        self.started = time.monotonic()

    def total_kb(self) -> int:
        return sum(rss_kb(p) for p in descendants(self.root))

    def run(self) -> None:
        while not self.stop.is_set():
            kb = self.total_kb()
            if kb > self.peak_kb:
                self.peak_kb, self.peak_at_s = kb, time.monotonic() - self.started
            self.peak_gateway_kb = max(self.peak_gateway_kb, rss_kb(self.root))
            time.sleep(self.period_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-audio-s", type=float, default=3600)
    ap.add_argument("--port", type=int, default=18391)
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="tideserve-mem-"))
    doc = yaml.safe_load((ROOT / "examples" / "whisper-tiny-en.yaml").read_text())
    doc["spec"]["pools"][0]["replicas"] = {"min": 1, "max": 1}
    doc["spec"]["gateway"].update(port=args.port, max_audio_s=args.max_audio_s, request_timeout_s=args.timeout_s,
                                  hold_timeout_s=args.timeout_s)
    ep = tmp / "ep.yaml"
    ep.write_text(yaml.safe_dump(doc))
    (tmp / "local.yaml").write_text(yaml.safe_dump({"cache_dir": str(tmp / "cache")}))
    body = long_audio(args.max_audio_s)
    url = f"http://127.0.0.1:{args.port}"
    with open(tmp / "up.log", "w") as log:
        up = subprocess.Popen([str(ROOT / ".venv" / "bin" / "tideserve"), "up", str(ep), "--config",
                               str(tmp / "local.yaml"), "--log-format", "text"], stdout=log, stderr=subprocess.STDOUT)
    try:
        short = long_audio(2.0)
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.post(f"{url}/v1/audio/transcriptions", files={"file": ("a.flac", short)},
                              data={"model": doc["spec"]["model"]["name"]}, timeout=120).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not answer; see {tmp / 'up.log'}")
            time.sleep(0.5)
        time.sleep(1.0)  # let the warm-up request's buffers be freed before the idle reading
        procs = descendants(up.pid)
        idle_kb = sum(rss_kb(p) for p in procs)
        from tideserve.worker.prep import default_processes

        n_prep = default_processes()  # what the worker starts on this machine (no prep_processes set)
        tree = [{"pid": p, "rss_mb": round(rss_kb(p) / 1024, 1), "cmd": cmdline(p)[:120]} for p in procs]
        sampler = Sampler(up.pid)
        sampler.start()

        def one(i: int) -> dict:
            t0, tries = time.monotonic(), 0
            while True:
                tries += 1
                r = httpx.post(f"{url}/v1/audio/transcriptions", files={"file": (f"{i}.flac", body)},
                               data={"model": doc["spec"]["model"]["name"]}, timeout=args.timeout_s)
                if r.status_code == 503 and "Retry-After" in r.headers and time.monotonic() - t0 < args.timeout_s:
                    time.sleep(float(r.headers["Retry-After"]))
                    continue
                return {"status": r.status_code, "tries": tries, "latency_s": round(time.monotonic() - t0, 1),
                        "text": r.json().get("text", r.text[:200]) if r.status_code == 200 else r.text[:300]}

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            results = list(pool.map(one, range(args.clients)))
        wall = time.monotonic() - t0
        for row in tree:
            row["peak_rss_mb"] = round(rss_kb(row["pid"], "VmHWM") / 1024, 1)
        sampler.stop.set()
        sampler.join()
        in_flight_s = 2 * args.max_audio_s
        budget_mb = 2 * in_flight_s / 60 + 6 * args.max_audio_s / 60 * (n_prep + 1)
        peak_inc_mb = (sampler.peak_kb - idle_kb) / 1024
        out = {
            "command": "python bench/memory_budget.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "clients": args.clients, "max_audio_s": args.max_audio_s, "max_audio_s_in_flight": in_flight_s,
            "upload_bytes": len(body), "replica_processes": tree, "prep_processes": n_prep,
            "idle_rss_mb": round(idle_kb / 1024, 1), "peak_rss_mb": round(sampler.peak_kb / 1024, 1),
            "peak_at_s": round(sampler.peak_at_s, 1), "peak_increase_mb": round(peak_inc_mb, 1),
            "budget_mb": round(budget_mb, 1), "within_budget": peak_inc_mb <= budget_mb,
            "mb_per_admitted_audio_min": round(peak_inc_mb / (in_flight_s / 60), 2),
            "issue_example_mb_per_audio_min": 12.0,
            "gateway_peak_rss_mb": round(sampler.peak_gateway_kb / 1024, 1),
            "wall_s": round(wall, 1), "statuses": [r["status"] for r in results],
            "tries": [r["tries"] for r in results], "latency_s": [r["latency_s"] for r in results],
            "texts": sorted({r["text"] for r in results}),
        }
        print(json.dumps(out, indent=2))
        if args.json:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
        return 0 if out["within_budget"] and all(s == 200 for s in out["statuses"]) else 1
    finally:
        stop(up, signal.SIGTERM, 30)


if __name__ == "__main__":
    raise SystemExit(main())
