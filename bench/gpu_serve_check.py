"""Drive a running endpoint (``tideserve up``) with concurrent requests and save what it reports:
per-request status and latency, ``/admin/status``, and the ``/metrics`` text of the gateway and
of every replica (found through the gateway's Prometheus service discovery, ``/admin/sd``).

    python bench/gpu_serve_check.py --url http://127.0.0.1:8080 --audio a.wav b.wav --requests 64 --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import time
from pathlib import Path

import httpx


async def wait_ready(client: httpx.AsyncClient, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if (await client.get(f"{url}/v2/health/ready")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)
    raise SystemExit(f"{url} not ready after {timeout_s} s")


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--audio", type=Path, nargs="+", required=True)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--worker-token-file", type=Path, default=Path.home() / ".cache" / "tideserve" / "worker-token",
                    help="the workers' token (local config worker_token_file; default <cache_dir>/worker-token)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    bodies = [json.dumps({"audio_data": base64.b64encode(p.read_bytes()).decode()}) for p in a.audio]
    async with httpx.AsyncClient(timeout=300) as client:
        await wait_ready(client, a.url, 600)

        async def one(i: int) -> dict:
            t0 = time.perf_counter()
            r = await client.post(f"{a.url}/invocations", content=bodies[i % len(bodies)],
                                  headers={"Content-Type": "application/json"})
            is_json = r.headers.get("content-type", "").startswith("application/json")
            return {"i": i, "status": r.status_code, "latency_s": time.perf_counter() - t0,
                    "text": r.json().get("transcribe_text", r.text[:200]) if is_json else r.text[:200]}

        first = await one(0)  # the first request may wait for a replica (cold start)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(1, a.requests + 1)))
        wall = time.perf_counter() - t0
        ok = [r for r in results if r["status"] == 200]
        lat = sorted(r["latency_s"] for r in ok)
        summary = {"first": first, "requests": len(results), "ok": len(ok), "wall_s": wall,
                   "p50_s": statistics.median(lat) if lat else None, "max_s": lat[-1] if lat else None,
                   "sample_texts": [r["text"] for r in results[:3]]}
        (a.out / "requests.json").write_text(json.dumps({"summary": summary, "results": results}, indent=2))
        (a.out / "admin_status.json").write_text((await client.get(f"{a.url}/admin/status")).text)
        (a.out / "gateway_metrics.txt").write_text((await client.get(f"{a.url}/metrics")).text)
        sd = (await client.get(f"{a.url}/admin/sd")).json()
        texts = []
        for group in sd:
            for target in group.get("targets", []):
                texts.append((await client.get(f"http://{target}/metrics", headers={
                    "X-Tideserve-Token": a.worker_token_file.read_text().strip()})).text)
        (a.out / "worker_metrics.txt").write_text("\n".join(texts))
        print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] == summary["requests"] else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
