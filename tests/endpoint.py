"""Start and stop a real ``tideserve up`` process for integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "whisper-tiny-en.yaml"


def _die_with_parent() -> None:
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def write_endpoint(tmp: Path, name: str = "endpoint.yaml", pools: list[dict] | None = None,
                   min_replicas: int | None = 1, **spec_overrides: Any) -> Path:
    """The default example with ``spec`` keys overridden, gateway on port 0; returns its path.

    ``min_replicas`` (default 1, so that a replica is up when the test starts) overrides the
    example's pool minimum; None keeps the example's own (0: scale to zero).
    """
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"] = _merge(doc["spec"], {"gateway": {"port": 0}})
    doc["spec"] = _merge(doc["spec"], spec_overrides)
    if pools is not None:
        doc["spec"]["pools"] = pools
    elif min_replicas is not None:
        doc["spec"]["pools"][0]["replicas"]["min"] = min_replicas
    path = tmp / name
    path.write_text(yaml.safe_dump(doc))
    return path


class EndpointProcess:
    """``tideserve up FILE`` in a subprocess; waits until every pool reaches a settled state.

    ``wait_ready``: wait for ready == desired in each pool (else only for the gateway).
    """

    def __init__(self, endpoint_file: Path, tmp: Path, config: dict | None = None, wait_ready: bool = True,
                 scheme: str = "http", verify: Any = True, api_key: str | None = None, start_timeout_s: float = 120,
                 extra_args: tuple[str, ...] = (), wait_started: bool = True) -> None:
        self.extra_args = extra_args
        self.wait_started = wait_started
        self.file = endpoint_file
        self.tmp = tmp
        self.config = config
        self.wait_ready = wait_ready
        self.scheme = scheme
        self.verify = verify
        self.api_key = api_key
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path = tmp / "up.log"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def client(self, **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.url, verify=self.verify, timeout=kw.pop("timeout", 120), headers=headers, **kw)

    def status(self) -> dict:
        with self.client(timeout=10) as c:
            r = c.get("/admin/status")
            r.raise_for_status()
            return r.json()

    def wait_for(self, predicate, timeout_s: float = 60, what: str = "condition") -> dict:
        """Poll /admin/status until ``predicate(status)`` holds; fail with the last status."""
        deadline = time.monotonic() + timeout_s
        last: dict = {}
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                last = self.status()
                if predicate(last):
                    return last
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last status: {json.dumps(last)[:2000]}\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"tideserve up exited with {self.proc.returncode}:\n{self.log_tail()}")

    def worker_pids(self) -> list[int]:
        return [r["pid"] for p in self.status()["pools"] for r in p["replicas"] if r["pid"]]

    def worker_metrics(self) -> str:
        """Concatenated /metrics text of every ready replica (found through the gateway's SD)."""
        with self.client(timeout=10) as c:
            groups = c.get("/admin/sd").json()
        text = ""
        for g in groups:
            for t in g["targets"]:
                text += httpx.get(f"http://{t}/metrics", timeout=10, headers={"X-Tideserve-Token": self.worker_token}).text
        return text

    @property
    def worker_token_file(self) -> Path:
        """The file ``up`` keeps the workers' token in (worker_token_file, else <cache_dir>/worker-token)."""
        cfg = self.config or {}
        if "worker_token_file" in cfg:
            return Path(cfg["worker_token_file"])
        return Path(cfg.get("cache_dir", self.tmp / "cache")) / "worker-token"

    @property
    def worker_token(self) -> str:
        return self.worker_token_file.read_text().strip()

    def __enter__(self) -> EndpointProcess:
        port_file = self.tmp / "gateway.port"
        cmd = [sys.executable, "-m", "tideserve", "up", str(self.file), "--port-file", str(port_file)]
        # Each test endpoint has its own model/engine cache, unless the test gives one.
        config = {"cache_dir": str(self.tmp / "cache"), **(self.config or {})}
        cfg_path = self.tmp / "local-config.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        cmd += ["--config", str(cfg_path), *self.extra_args]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("TIDESERVE_CONFIG", None)
        self._log = open(self.log_path, "wb")
        # The endpoint dies with the test process, even if a test forgets to stop it.
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=self.tmp,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + self.start_timeout_s
        while not port_file.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"gateway did not start:\n{self.log_tail()}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        if self.wait_ready:
            self.wait_for(
                lambda s: s["started"] and all(p["ready"] == p["desired"] for p in s["pools"]),
                self.start_timeout_s, "every replica to be ready",
            )
        elif self.wait_started:
            self.wait_for(lambda s: s["started"], self.start_timeout_s, "the runtime to start")
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __exit__(self, *exc: Any) -> None:
        self.stop()
