"""Scale to zero and back with real processes; no request lost."""

from __future__ import annotations

import base64
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from audio import encode, wer
from endpoint import EndpointProcess, write_endpoint


def _burst(ep: EndpointProcess, clips, n: int, concurrency: int = 20) -> list:
    bodies = [(c, {"audio_data": base64.b64encode(c.wav).decode()}) for c in clips]
    with ep.client(timeout=300) as client, ThreadPoolExecutor(concurrency) as pool:
        def send(i):
            clip, body = bodies[i % len(bodies)]
            return clip, client.post("/invocations", json=body)

        return list(pool.map(send, range(n)))


# Real transcriptions: on a busy 2-core machine they take several times longer than idle, so
# these tests do only the work their behaviour needs, under a safety-net timeout of 10 minutes.
@pytest.mark.timeout(600)
def test_burst_scale_up_back_to_zero_second_burst(tmp_path, en_clips):
    path = write_endpoint(
        tmp_path,
        pools=[{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8",
                "replicas": {"min": 0, "max": 2}, "max_concurrency": 4, "cost_usd_per_h": 0.1}],
        autoscaling={"target": 4, "scale_to_zero_after_s": 2, "scale_down_stabilization_s": 1, "interval_s": 0.2},
        gateway={"hold_timeout_s": 300},  # a cold start on a busy machine can take minutes
    )
    with EndpointProcess(path, tmp_path, config={"replica_slots": 2}) as ep:
        assert ep.status()["pools"][0]["replicas"] == []  # min 0: nothing runs before traffic
        # 16 requests at once against a target of 4 per replica: the policy wants 4, the max is 2.
        results = _burst(ep, en_clips, 16, concurrency=16)
        # back to zero once no request arrived for scale_to_zero_after_s
        st = ep.wait_for(lambda s: s["pools"][0]["replicas"] == [], 60, "scale to zero")
        assert st["last_decision"]["total"] == 0 and "no request arrival" in st["last_decision"]["reason"]
        results += _burst(ep, en_clips, 16, concurrency=16)
        log = ep.log_path.read_text()

    assert len(results) == 32
    for clip, r in results:
        assert r.status_code == 200, r.text
        assert wer(clip.reference, r.json()["transcribe_text"]) <= 0.15
    # The first burst scaled out to the max (2 replicas): both were started.
    assert "cpu-1" in log and log.count('"replica starting"') + log.count("replica starting") >= 3


@pytest.mark.timeout(600)
def test_killed_replica_requests_are_retried_on_another(tmp_path, en_clips):
    path = write_endpoint(
        tmp_path,
        pools=[{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8",
                "replicas": {"min": 2, "max": 2}, "max_concurrency": 8}],
        batching={"max_batch_size": 1, "max_queue_delay_ms": 0},
    )
    with EndpointProcess(path, tmp_path) as ep:
        results: list = []
        t = threading.Thread(target=lambda: results.extend(_burst(ep, en_clips, 16, concurrency=16)))
        t.start()
        # Kill the replica holding the most requests once both hold some.
        st = ep.wait_for(lambda s: all(r["outstanding"] >= 2 for r in s["pools"][0]["replicas"]), 60,
                         "both replicas busy")
        victim = max(st["pools"][0]["replicas"], key=lambda r: r["outstanding"])
        os.kill(victim["pid"], signal.SIGKILL)
        t.join(300)
        metrics = ep.client().get("/metrics").text
    assert len(results) == 16
    for clip, r in results:
        assert r.status_code == 200, r.text
        assert wer(clip.reference, r.json()["transcribe_text"]) <= 0.15
    retried = sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("tideserve_retries_total"))
    assert retried >= 2, "the killed replica's outstanding requests went to the other replica"


@pytest.mark.timeout(600)
def test_scale_down_during_long_requests_cuts_none_off(tmp_path, en_clips):
    path = write_endpoint(
        tmp_path,
        pools=[{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8",
                "replicas": {"min": 0, "max": 2}, "max_concurrency": 1}],
        autoscaling={"target": 1, "scale_to_zero_after_s": 1, "scale_down_stabilization_s": 0, "interval_s": 0.2},
    )
    # About 100 s of speech each: several seconds of compute, longer than the idle timer.
    speech = np.concatenate([np.concatenate([c.samples, np.zeros(16000, np.float32)]) for c in en_clips] * 10)
    long_clip = en_clips[0].__class__("long", encode(speech, "flac"), " ".join([c.reference for c in en_clips] * 10), speech)
    with EndpointProcess(path, tmp_path, config={"replica_slots": 2}) as ep:
        results = _burst(ep, [long_clip], 2, concurrency=2)
        ep.wait_for(lambda s: s["pools"][0]["replicas"] == [], 60, "scale to zero")
        log = ep.log_path.read_text()
    for _, r in results:
        assert r.status_code == 200, r.text
        assert wer(long_clip.reference, r.json()["transcribe_text"]) <= 0.15
    assert "replica draining" in log and "drained; exiting" in log


@pytest.mark.timeout(600)
def test_heterogeneous_pools_both_serve_and_are_measured(tmp_path, en_clips):
    """int8 and fp32 pools, one replica each, behind one gateway: every request is served
    correctly by whichever pool it is routed to, and the gateway measures a service rate for
    each pool that served. Which pool is faster depends on this machine and its load, so that
    comparison is a benchmark (bench/heterogeneous_pools.py); the routing rule itself is checked
    on scripted service times in tests/unit/gateway/test_service_rate_routing.py."""
    path = write_endpoint(tmp_path, pools=[
        {"name": "cpu-int8", "accelerator": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 1, "max": 1},
         "max_concurrency": 4, "cost_usd_per_h": 0.10},
        {"name": "cpu-fp32", "accelerator": "cpu", "target": "cpu-x86_64-fp32", "replicas": {"min": 1, "max": 1},
         "max_concurrency": 4, "cost_usd_per_h": 0.20},
    ], batching={"max_batch_size": 1, "max_queue_delay_ms": 0})
    with EndpointProcess(path, tmp_path) as ep:
        results = _burst(ep, en_clips, 36, concurrency=4)
        st = ep.status()
        metrics = ep.client().get("/metrics").text
    for clip, r in results:
        assert r.status_code == 200, r.text
        assert wer(clip.reference, r.json()["transcribe_text"]) <= 0.15
    routed = {}
    for line in metrics.splitlines():
        if line.startswith("tideserve_routing_decisions_total"):
            pool = line.split('pool="')[1].split('"')[0]
            routed[pool] = float(line.split()[-1])
    assert sum(routed.values()) == 36 and set(routed) <= {"cpu-int8", "cpu-fp32"}, routed
    rates = st["gateway"]["service_rates"]
    assert set(rates) == {p for p, n in routed.items() if n > 0}, (rates, routed)
    assert all(r > 0 for r in rates.values()), rates
