"""Cold start: a first request at zero replicas, until its response, split into phases.

Starts ``tideserve up`` with the example endpoint at min 0 replicas, sends one request (the
gateway holds it and activates a replica at once), and splits the time to its response into
process start, imports, model load, readiness detection (from the runtime's per-replica
start-up record; the HTTP imports and bind run while the model loads, so http_ready overlaps
model_load), and first inference (the rest: routing the held request, decoding it, answering).
Then a warm request with the same clip, side by side. Repeats ``--runs`` times with a fresh
endpoint each time and prints each run and the median, in two cases: scale from zero after an
idle period (the zygote, which forks replicas, has finished importing) and a first request
right after `tideserve up` (the zygote is still importing).

Goal (issue): under 2 s on this machine for tiny.en. Run: .venv/bin/python bench/cold_start.py
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from endpoint import EndpointProcess, write_endpoint  # noqa: E402

PHASES = ("process_start_s", "imports_s", "model_load_s", "http_ready_s", "readiness_detection_s")


def one_run(clip: bytes, warm_zygote: bool) -> dict:
    body = {"audio_data": base64.b64encode(clip).decode()}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_endpoint(
            Path(tmp),
            pools=[{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 0, "max": 1}}],
            autoscaling={"scale_to_zero_after_s": 600},
        )
        with EndpointProcess(path, Path(tmp)) as ep, ep.client(timeout=120) as c:
            assert ep.status()["pools"][0]["replicas"] == []
            if warm_zygote:  # as after an idle period: the template process has finished importing
                ep.wait_for(lambda s: s["zygote"] in ("ready", "off"), 60, "the zygote")
            t = time.perf_counter()
            r = c.post("/invocations", json=body)
            cold = time.perf_counter() - t
            r.raise_for_status()
            startup = ep.status()["pools"][0]["replicas"][0]["startup"]
            t = time.perf_counter()
            c.post("/invocations", json=body).raise_for_status()
            warm = time.perf_counter() - t
    out = {k: startup[k] for k in PHASES}
    out["first_inference_s"] = cold - startup["total_s"]
    out["cold_total_s"] = cold
    out["warm_s"] = warm
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import pytest_audioeval

    clip = (Path(next(iter(pytest_audioeval.__path__))) / "samples/audio/en/hello_world.wav").read_bytes()
    cols = [*PHASES, "first_inference_s", "cold_total_s", "warm_s"]
    goal = 2.0
    for warm_zygote, title in ((True, "scale from zero (endpoint idle, zygote ready)"),
                               (False, "right after `tideserve up` (zygote still importing)")):
        runs = [one_run(clip, warm_zygote) for _ in range(args.runs)]
        print(f"cold start of tiny.en (s), first request at zero replicas -> its response: {title}")
        print("  " + " ".join(f"{c.removesuffix('_s'):>20}" for c in cols))
        for r in runs:
            print("  " + " ".join(f"{r[c]:20.3f}" for c in cols))
        med = {c: statistics.median(r[c] for r in runs) for c in cols}
        print("  " + " ".join(f"{med[c]:20.3f}" for c in cols) + "   <- median")
        verdict = "meets" if med["cold_total_s"] < goal else f"misses by {med['cold_total_s'] - goal:.2f} s"
        print(f"  median cold start {med['cold_total_s']:.2f} s vs warm {med['warm_s']:.2f} s; goal < {goal:.1f} s: {verdict}\n")


if __name__ == "__main__":
    main()
