"""Work for a client that went away is dropped, not computed."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time

import numpy as np
from audio import encode
from endpoint import EndpointProcess, write_endpoint
from tideserve.metrics.parse import sample_value
from tideserve.worker.longform import is_digital_silence
from tideserve.worker.windows import window_cuts


def _wait_metric(ep: EndpointProcess, pred, what: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = ep.worker_metrics()
        if pred(text):
            return text
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}\n{text}")


def test_disconnected_client_work_is_dropped(tmp_path, en_clips):
    # Batches of one window on one model instance, run in arrival order: request B queues behind
    # A's windows (with more instances B would start at once on the one kept for newcomers).
    # Without timestamp tokens no window tail is decoded again, so A runs exactly its windows.
    path = write_endpoint(tmp_path, batching={"max_batch_size": 1, "max_queue_delay_ms": 0, "instances": 1},
                          model={"decoding": {"beam_size": 5, "without_timestamps": True}})
    speech = np.concatenate([np.concatenate([c.samples, np.zeros(16000, np.float32)]) for c in en_clips] * 30)
    long_wav = encode(speech, "flac")  # about 5 minutes
    # The worker's windows (worker.prep); any of digital silence is answered without the model.
    windows_a = sum(not is_digital_silence(speech[a:b]) for a, b in window_cuts(speech))
    assert windows_a >= 8
    short = en_clips[0].wav

    with EndpointProcess(path, tmp_path) as ep:
        before = ep.worker_metrics()
        result: dict = {}

        def send_a():
            with ep.client(timeout=300) as c:
                result["a"] = c.post("/invocations", json={"audio_data": base64.b64encode(long_wav).decode()})

        a = threading.Thread(target=send_a)
        a.start()
        _wait_metric(ep, lambda t: sample_value(t, "tideserve_worker_requests_in_batcher") == 1, "A in the batcher")

        # B: a raw HTTP request whose client closes the connection while B waits behind A.
        body = json.dumps({"audio_data": base64.b64encode(short).decode()}).encode()
        sock = socket.create_connection(("127.0.0.1", ep.port))
        sock.sendall(
            b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nX-Request-Id: client-gone\r\n\r\n".encode() + body
        )
        _wait_metric(ep, lambda t: sample_value(t, "tideserve_worker_requests_in_batcher") == 2, "B in the batcher")
        sock.close()
        _wait_metric(ep, lambda t: sample_value(t, "tideserve_worker_requests_in_batcher") == 1, "B gone")
        # The engine process reports the drop with its next counters (it runs beside the front).
        dropped0 = sample_value(before, "tideserve_worker_dropped")
        mid = _wait_metric(ep, lambda t: sample_value(t, "tideserve_worker_dropped") - dropped0 >= 1, "B dropped")
        assert sample_value(mid, "tideserve_worker_dropped") - dropped0 == 1

        a.join(300)
        after = ep.worker_metrics()

    assert result["a"].status_code == 200, result["a"].text
    windows_run = sample_value(after, "nv_inference_count") - sample_value(before, "nv_inference_count")
    assert windows_run == windows_a, "only A's windows were computed; B's was dropped"
    assert sample_value(after, "nv_inference_request_failure", {"reason": "CANCELED"}) == 1
    assert sample_value(after, "nv_inference_request_success") - sample_value(before, "nv_inference_request_success") == 1
