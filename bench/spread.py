"""A long file on one replica against the same file spread over two (issue 13,
``spec.gateway.spread_min_audio_s``), side by side in one run: wall time of each, the ratio, and
whether the transcripts are the same. Not part of CI (minutes).

    .venv/bin/python bench/spread.py --minutes 5,20 --rounds 2 --json bench/results/spread.json

One endpoint (examples/whisper-tiny-en.yaml, two replicas always up) on ``--port``. "One replica"
is the file sent straight to one worker (with the workers' token, as the gateway sends it, but
without the gateway's offer of idle replicas), "spread" the same file through the gateway with
the other replica idle; the two take turns. By default each replica runs one model instance on
one thread (``--instances 1 --cpu-threads 1``): two one-core machines on this two-core one, so
that a second replica has a core of its own to bring (with the defaults each replica's three
instances already keep both cores busy and the comparison says nothing about spreading).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fairness import clips
from longfiles import long_file, wav_pcm16
from procs import stop

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--minutes", default="5,20", help="comma-separated lengths of the long files")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=18397)
    ap.add_argument("--instances", type=int, default=1, help="batching.instances per replica")
    ap.add_argument("--cpu-threads", type=int, default=1, help="cpu_threads_per_replica")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tideserve-spread-"))
    doc = yaml.safe_load((ROOT / "examples" / "whisper-tiny-en.yaml").read_text())
    doc["spec"]["pools"][0]["replicas"] = {"min": 2, "max": 2}
    doc["spec"]["batching"]["instances"] = args.instances
    doc["spec"]["model"]["decoding"]["beam_size"] = args.beam
    # A 20-minute 16-bit WAV is 38 MB: past the default max_body_bytes (25 MiB), so raised here.
    doc["spec"]["gateway"].update(port=args.port, request_timeout_s=3600, hold_timeout_s=3600,
                                  max_body_bytes=128 * 1024 * 1024)
    (tmp / "ep.yaml").write_text(yaml.safe_dump(doc))
    cache = tmp / "cache"
    (tmp / "local.yaml").write_text(yaml.safe_dump({"cache_dir": str(cache), "cpu_threads_per_replica": args.cpu_threads}))
    cs = clips()
    files = {m: wav_pcm16(long_file(cs, float(m), seed=3)[0]) for m in args.minutes.split(",")}
    url = f"http://127.0.0.1:{args.port}"
    with open(tmp / "up.log", "w") as log:
        up = subprocess.Popen([str(ROOT / ".venv" / "bin" / "tideserve"), "up", str(tmp / "ep.yaml"), "--config",
                               str(tmp / "local.yaml"), "--log-format", "text"], stdout=log, stderr=subprocess.STDOUT)
    try:
        gateway = httpx.Client(base_url=url, timeout=3600)
        deadline = time.monotonic() + 180
        while True:
            try:
                ready = [r for p in gateway.get("/admin/status").json()["pools"] for r in p["replicas"]
                         if r["state"] == "ready"]
                workers = sorted(f"http://{t}" for g in gateway.get("/admin/sd").json() for t in g["targets"])
                if len(ready) == 2 and len(workers) == 2:
                    break
            except (httpx.HTTPError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"two replicas did not become ready; see {tmp / 'up.log'}")
            time.sleep(0.5)
        token = (cache / "worker-token").read_text().strip()
        direct = httpx.Client(base_url=workers[0], timeout=3600, headers={"X-Tideserve-Token": token})

        def one(client: httpx.Client, wav: bytes) -> tuple[float, str, str]:
            t = time.perf_counter()
            r = client.post("/invocations", content=wav, headers={"Content-Type": "audio/wav"})
            assert r.status_code == 200, r.text
            return time.perf_counter() - t, r.json()["transcribe_text"], r.headers.get("X-Tideserve-Parts", "1")

        one(direct, next(c for c in cs if c.reference == "hello_world").wav)  # warm both paths
        rows = []
        for minutes, wav in files.items():
            alone, spread, same, parts = [], [], [], set()
            for _ in range(args.rounds):
                a_s, a_text, _ = one(direct, wav)
                s_s, s_text, n = one(gateway, wav)
                alone.append(a_s)
                spread.append(s_s)
                same.append(a_text == s_text)
                parts.add(n)
            rows.append({"minutes": float(minutes), "one_replica_s": [round(x, 2) for x in alone],
                         "spread_s": [round(x, 2) for x in spread], "parts": sorted(parts),
                         "same_text": all(same),
                         "ratio_median_one_to_spread": round(statistics.median(alone) / statistics.median(spread), 2)})
            print(json.dumps(rows[-1]), flush=True)
        out = {"command": "python bench/spread.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "instances": args.instances, "cpu_threads": args.cpu_threads, "beam": args.beam, "rows": rows}
        if args.json:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
        return 0
    finally:
        stop(up)


if __name__ == "__main__":
    raise SystemExit(main())
