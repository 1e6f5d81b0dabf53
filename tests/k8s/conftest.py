"""The loopback control plane (localcluster.py), started once for tests/k8s.

Run by `make test-k8s`, which first builds the pieces (scripts/k8s/build.sh). A piece that is
not built or does not start is printed at the start of the session with its reason; every test
that needs it fails naming it (``TIDESERVE_K8S_ALLOW_MISSING=1`` turns those failures into skips).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from localcluster import LocalCluster, require  # noqa: F401 - require: for the tests

SESSION_START = time.monotonic()
_cluster: LocalCluster | None = None


def _root() -> Path:
    keep = os.environ.get("TIDESERVE_K8S_RUN_DIR")
    if keep:
        p = Path(keep)
        p.mkdir(parents=True, exist_ok=True)
        return p
    return Path(tempfile.mkdtemp(prefix="tideserve-k8s-run-"))


@pytest.fixture(scope="session")
def cluster(request) -> LocalCluster:
    global _cluster
    root = _root()
    c = LocalCluster(root)
    _cluster = c
    request.addfinalizer(c.stop)
    t0 = time.monotonic()
    c.start()
    c.timings["total start"] = time.monotonic() - t0
    print(f"\nlocal cluster in {root} (logs in {root / 'logs'}):\n{c.report()}", file=sys.stderr)
    return c


def pytest_terminal_summary(terminalreporter) -> None:
    if _cluster is None:
        return
    terminalreporter.write_sep("-", "local Kubernetes cluster")
    terminalreporter.write_line(_cluster.report())
    for line in getattr(_cluster, "measurements", []):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"tests/k8s session: {time.monotonic() - SESSION_START:.0f}s")
