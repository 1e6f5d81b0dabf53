"""The worker's processes (issue 12): prep processes that die are replaced and the request is
answered; an engine process that dies takes its replica down, the runtime restarts it, and
requests are answered again; no request hangs."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import os
import signal
import time

import httpx
import pytest

from endpoint import EndpointProcess, write_endpoint

pytestmark = pytest.mark.integration


def invoke(ep: EndpointProcess, wav: bytes, timeout: float = 120) -> httpx.Response:
    with ep.client(timeout=timeout) as c:
        return c.post("/invocations", json={"audio_data": base64.b64encode(wav).decode()})


def test_dead_prep_processes_are_replaced_and_requests_answered(tmp_path, en_clips, long_clip):
    path = write_endpoint(tmp_path)
    with EndpointProcess(path, tmp_path) as ep:
        assert invoke(ep, en_clips[0].wav).status_code == 200
        (worker,) = ep.worker_pids()
        preps = _prep_pids(worker)
        assert preps, "no prep process found"
        for pid in preps:  # kill every prep process: the next request needs a new pool
            os.kill(pid, signal.SIGKILL)
        r = invoke(ep, long_clip.wav)
        assert r.status_code == 200 and r.json()["transcribe_text"]
        # Killed again while a request may be in a prep process: whichever stage the request is
        # in when they die, it is answered (the pool is replaced and the request retried once).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(invoke, ep, long_clip.wav)
            for pid in _prep_pids(worker):
                os.kill(pid, signal.SIGKILL)
            resp = pending.result(timeout=120)
        assert resp.status_code == 200, resp.text


def test_a_request_held_by_stopped_prep_processes_is_answered(tmp_path, en_clips):
    """Prep processes that stop (SIGSTOP here; in service a hang inside FFmpeg) hold the request
    for local config's prep_stall_s, then are ended and replaced, and the request is answered.
    Before, it waited for the request timeout (504; found by an adversarial helper)."""
    path = write_endpoint(tmp_path)
    with EndpointProcess(path, tmp_path, config={"prep_stall_s": 2}) as ep:
        assert invoke(ep, en_clips[0].wav).status_code == 200
        (worker,) = ep.worker_pids()
        stopped = _prep_pids(worker)
        assert stopped, "no prep process found"
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            r = invoke(ep, en_clips[0].wav, timeout=120)
            assert r.status_code == 200, r.text
            assert time.monotonic() - started < 60  # not the 300 s request timeout
            assert not set(stopped) & set(_prep_pids(worker))  # replaced
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        assert "prep_stall_s" in ep.log_path.read_text()


def test_a_dead_engine_restarts_the_replica_and_requests_are_answered(tmp_path, en_clips):
    path = write_endpoint(tmp_path)
    with EndpointProcess(path, tmp_path) as ep:
        assert invoke(ep, en_clips[0].wav).status_code == 200
        (worker,) = ep.worker_pids()
        engine = _engine_pid(worker)
        os.kill(engine, signal.SIGKILL)
        # The request that meets the dead engine is answered at once with a documented status: 200
        # (another replica or the restarted one took it) or 503 with Retry-After, never a 500 or a hang.
        r = invoke(ep, en_clips[0].wav, timeout=120)
        assert r.status_code in (200, 503), r.text
        if r.status_code == 503:
            assert r.headers["Retry-After"]
        # The replica exits (its engine is gone), the runtime starts a new one, and it answers.
        ep.wait_for(lambda s: any(rep["pid"] not in (None, worker) and rep["state"] == "ready"
                                  for p in s["pools"] for rep in p["replicas"]), timeout_s=180, what="a new replica")
        r = invoke(ep, en_clips[0].wav, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["transcribe_text"]


def test_a_stopped_engine_is_ended_and_its_replica_restarted(tmp_path, en_clips):
    """An engine process that stops making progress (here SIGSTOP; in service a hung device
    call) is found by its missing heartbeats within local config's engine_stall_s: it is ended,
    the request is answered (503 with Retry-After, or 200 from the restarted replica, the
    gateway holding it), and the replica restarts. Before, the replica stayed ready and every
    request to it waited for request_timeout_s (found by an adversarial helper)."""
    path = write_endpoint(tmp_path)
    with EndpointProcess(path, tmp_path, config={"engine_stall_s": 2}) as ep:
        assert invoke(ep, en_clips[0].wav).status_code == 200
        (worker,) = ep.worker_pids()
        engine = _engine_pid(worker)
        os.kill(engine, signal.SIGSTOP)
        try:
            started = time.monotonic()
            r = invoke(ep, en_clips[0].wav, timeout=120)
            assert r.status_code in (200, 503), r.text
            if r.status_code == 503:
                assert r.headers["Retry-After"]
            assert time.monotonic() - started < 100  # not the 300 s request timeout
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine, signal.SIGKILL)
        ep.wait_for(lambda s: any(rep["pid"] not in (None, worker) and rep["state"] == "ready"
                                  for p in s["pools"] for rep in p["replicas"]), timeout_s=180, what="a new replica")
        r = invoke(ep, en_clips[0].wav, timeout=120)
        assert r.status_code == 200, r.text
        assert "no progress for" in ep.log_path.read_text()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _prep_pids(worker: int) -> list[int]:
    """The prep processes: children of the worker's multiprocessing forkserver."""
    servers = [p for p in _children(worker) if "multiprocessing.forkserver" in _cmdline(p)]
    return [c for s in servers for c in _children(s)]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _engine_pid(worker: int) -> int:
    """The engine is the worker's forked child (same command line); the prep forkserver runs
    ``multiprocessing.forkserver``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        engines = [p for p in _children(worker) if "multiprocessing" not in _cmdline(p)]
        if len(engines) == 1:
            return engines[0]
        time.sleep(0.1)
    raise AssertionError(f"engine process of {worker} not found among {_children(worker)}")
