"""Concurrent requests of different lengths share model executions (real batched inference)."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from audio import Clip, encode, wer
from endpoint import EndpointProcess, write_endpoint
from tideserve.metrics.parse import sample_value


def test_eight_concurrent_requests_fewer_executions(tmp_path, en_clips):
    # The longest queue delay the spec allows, so that the 8 requests arriving in the window does
    # not depend on how fast a busy machine gets them there; it costs nothing, as a full batch
    # (8 one-window requests) is cut at once.
    path = write_endpoint(tmp_path, batching={"max_batch_size": 8, "max_queue_delay_ms": 10_000})
    # 8 clips of different lengths: the three clips with different amounts of leading silence.
    clips = []
    for i in range(8):
        base = en_clips[i % len(en_clips)]
        samples = np.concatenate([np.zeros(int(0.25 * i * 16000), np.float32), base.samples])
        clips.append(Clip(f"{base.name}-{i}", encode(samples, "wav"), base.reference, samples))
    assert len({c.duration_s for c in clips}) == 8

    with EndpointProcess(path, tmp_path) as ep:
        before = ep.worker_metrics()
        with ep.client() as c, ThreadPoolExecutor(8) as pool:
            def send(clip: Clip):
                return c.post("/invocations", json={"audio_data": base64.b64encode(clip.wav).decode()})

            responses = list(pool.map(send, clips))
        after = ep.worker_metrics()

    for clip, r in zip(clips, responses, strict=True):
        assert r.status_code == 200, r.text
        assert wer(clip.reference, r.json()["transcribe_text"]) <= 0.15, (clip.name, r.json())
    executions = sample_value(after, "nv_inference_exec_count") - sample_value(before, "nv_inference_exec_count")
    inferences = sample_value(after, "nv_inference_count") - sample_value(before, "nv_inference_count")
    assert inferences == 8
    assert 1 <= executions < 8, executions
    assert sample_value(after, "nv_inference_request_success") - sample_value(before, "nv_inference_request_success") == 8
