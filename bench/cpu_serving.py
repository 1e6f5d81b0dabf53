"""CPU serving, this tree against another (e.g. the commit before the multi-process worker), side
by side in one run: the same endpoint (tiny.en int8, faster-whisper, one replica), the same
audio, closed-loop clients at each concurrency, the two trees taking turns round after round so
that machine noise falls on both (issue 12: the CPU path must not get slower on 2 cores).

    git worktree add /tmp/base <commit> && (cd /tmp/base && make .venv/.run-installed)
    python bench/cpu_serving.py --base /tmp/base --clients 8,16 --requests 48 --rounds 3

Prints and writes (``--json``) throughput (audio-s per s), p50 and p99 per tree and
concurrency, and the ratios this/base (median over rounds).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

from longfiles import wav_pcm16
from procs import stop

ROOT = Path(__file__).resolve().parents[1]
SR = 16_000


def clips() -> list[tuple[bytes, float]]:
    """The shipped English clips and a 40 s file of them joined (16 kHz int16 WAV)."""
    import pytest_audioeval

    d = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "en"
    sys.path.insert(0, str(ROOT / "src"))
    from tideserve.worker.audio import decode_pcm16

    pcm = [decode_pcm16(p.read_bytes()) for p in sorted(d.glob("*.wav"))]
    joined = np.concatenate([x for _ in range(4) for c in pcm for x in (c, np.zeros(SR, np.int16))])
    out = []
    for x in [*pcm, joined]:
        out.append((wav_pcm16(x), len(x) / SR))
    return out


def serve(root: Path, tmp: Path, port: int) -> subprocess.Popen:
    doc = yaml.safe_load((root / "examples" / "whisper-tiny-en.yaml").read_text())
    doc["spec"]["pools"][0]["replicas"] = {"min": 1, "max": 1}
    doc["spec"]["pools"][0]["max_concurrency"] = 64
    doc["spec"]["gateway"]["port"] = port
    ep = tmp / f"ep-{port}.yaml"
    ep.write_text(yaml.safe_dump(doc))
    cfg = tmp / f"local-{port}.yaml"
    cfg.write_text(yaml.safe_dump({"cache_dir": str(tmp / "cache")}))
    return subprocess.Popen([str(root / ".venv" / "bin" / "tideserve"), "up", str(ep), "--config", str(cfg),
                             "--log-format", "text"], stdout=open(tmp / f"up-{port}.log", "w"), stderr=subprocess.STDOUT)


def load(url: str, bodies: list[tuple[bytes, float]], clients: int, requests: int) -> dict:
    payloads = [json.dumps({"audio_data": base64.b64encode(b).decode()}) for b, _ in bodies]

    def one(i: int) -> tuple[float, float, int]:
        t0 = time.perf_counter()
        r = httpx.post(f"{url}/invocations", content=payloads[i % len(payloads)],
                       headers={"Content-Type": "application/json"}, timeout=600)
        return time.perf_counter() - t0, bodies[i % len(bodies)][1], r.status_code

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        res = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - t0
    lat = [r[0] for r in res if r[2] == 200]
    return {"rtfx": sum(r[1] for r in res if r[2] == 200) / wall, "p50_s": float(np.percentile(lat, 50)),
            "p99_s": float(np.percentile(lat, 99)), "ok": len(lat), "requests": requests}


def wait_ready(url: str, body: bytes, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    payload = json.dumps({"audio_data": base64.b64encode(body).decode()})
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"{url}/invocations", content=payload, timeout=120,
                          headers={"Content-Type": "application/json"}).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not answer")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the other tree (with its .venv)")
    ap.add_argument("--clients", default="8,16")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=18300)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    tmp = Path("/tmp/cpu_serving")
    tmp.mkdir(exist_ok=True)
    bodies = clips()
    results: dict = {"this": {}, "base": {}}
    for rnd in range(a.rounds):
        for name, root in (("base", a.base), ("this", ROOT)) if rnd % 2 == 0 else (("this", ROOT), ("base", a.base)):
            port = a.port + rnd * 2 + (name == "this")
            proc = serve(root, tmp, port)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_ready(url, bodies[0][0])
                load(url, bodies, 4, 8)  # warm-up
                for c in (int(x) for x in a.clients.split(",")):
                    r = load(url, bodies, c, a.requests)
                    results[name].setdefault(str(c), []).append(r)
                    print(json.dumps({"round": rnd, "tree": name, "clients": c, **r}), flush=True)
            finally:
                stop(proc)
    summary = {}
    for c in results["this"]:
        med = {t: {k: statistics.median(r[k] for r in results[t][c]) for k in ("rtfx", "p50_s", "p99_s")}
               for t in ("this", "base")}
        summary[c] = {"this": med["this"], "base": med["base"],
                      "rtfx_ratio": med["this"]["rtfx"] / med["base"]["rtfx"],
                      "p50_ratio": med["this"]["p50_s"] / med["base"]["p50_s"],
                      "p99_ratio": med["this"]["p99_s"] / med["base"]["p99_s"]}
    out = {"clients": a.clients, "requests": a.requests, "rounds": a.rounds, "cpu_count": os.cpu_count(),
           "loadavg_before_after": os.getloadavg(), "summary": summary, "runs": results}
    print(json.dumps(summary, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
