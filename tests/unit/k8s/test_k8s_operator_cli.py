"""``tideserve operator``: argument checks, and the command run as a process against a kmock API
server (standalone, liveness endpoint, status patched, clean stop on SIGTERM)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))

from kube_mock import mock_server, until, write_kubeconfig

from tideserve.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
IE_PATH = "/apis/tideserve.io/v1alpha1/namespaces/default/inferenceendpoints"


def test_operator_needs_exactly_one_scope(tmp_path: Path) -> None:
    runner = CliRunner()
    for args in ([], ["-A", "-n", "prod"]):
        res = runner.invoke(app, ["operator", *args])
        assert res.exit_code == 2
        assert "pass --namespace NS (one or more) or --all-namespaces, not both or neither" in res.output
    res = runner.invoke(app, ["operator", "-A", "--kubeconfig", str(tmp_path / "missing")])
    assert res.exit_code == 2 and f"--kubeconfig {tmp_path / 'missing'}: no such file" in res.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_operator_command_serves_liveness_patches_status_and_stops_on_sigterm(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with mock_server() as mock:
            kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(mock.url).rstrip("/"))
            port = _free_port()
            src = str(Path(__file__).resolve().parents[3] / "src")
            env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tideserve.cli.main", "operator", "--all-namespaces",
                "--kubeconfig", str(kubeconfig), "--liveness", f"http://127.0.0.1:{port}/healthz",
                "--log-format", "text", env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            try:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 120
                async with aiohttp.ClientSession() as http:
                    while True:
                        assert proc.returncode is None, "the operator exited early"
                        assert loop.time() < deadline, "no liveness answer within 120 s"
                        try:
                            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                                if resp.status == 200:
                                    break
                        except aiohttp.ClientError:
                            pass
                        await asyncio.sleep(0.05)

                body = yaml.safe_load((EXAMPLES / "whisper-tiny-en.yaml").read_text())
                body["metadata"].update(namespace="default", uid="u-1", generation=1, resourceVersion="1")
                await mock.post(IE_PATH, json=body)
                # With the placeholder renderer Degraded, with the real one Ready or Degraded
                # (kinds the mock does not serve): either way the status comes back.
                await until("status conditions patched back",
                            lambda: (mock.objects[IE_PATH.replace("/apis/", "").replace("/namespaces/default", ""),
                                                  "default", "whisper"].get("status") or {}).get("conditions"),
                            timeout_s=60)
            finally:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                out, _ = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, out.decode(errors="replace")[-3000:]

    asyncio.run(asyncio.wait_for(scenario(), 280))  # safety nets for events on a busy machine
