"""Files of upstream Go modules (KEDA's, Karpenter's and the Prometheus operator's CRDs, KEDA's
external-scaler proto),
taken from the Go module proxy at the versions in scripts/k8s/versions: the same modules
`make test-k8s` builds and installs, so the unit tests check against what the cluster runs.

A file is read from, in order: our cache (``$TIDESERVE_K8S_CACHE/modules``, default
``~/.cache/tideserve-k8s/modules``), Go's module cache (``go mod download`` or a build put the
module there), or the module's zip from ``$GOPROXY`` (default https://proxy.golang.org), whose
wanted files are then kept in our cache. Nothing is written into the repository.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import urllib.request
import zipfile
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSIONS_FILE = REPO / "scripts" / "k8s" / "versions"
CACHE = Path(os.environ.get("TIDESERVE_K8S_CACHE") or Path.home() / ".cache" / "tideserve-k8s")
TIMEOUT_S = 120.0


@cache
def versions() -> dict[str, str]:
    out = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


KEDA = ("github.com/kedacore/keda/v2", "KEDA_VERSION")
KARPENTER = ("sigs.k8s.io/karpenter", "KARPENTER_VERSION")
KARPENTER_AWS = ("github.com/aws/karpenter-provider-aws", "KARPENTER_AWS_VERSION")
PROMETHEUS_OPERATOR = ("github.com/prometheus-operator/prometheus-operator", "PROMETHEUS_OPERATOR_VERSION")

#: (module, version key, path in the module) of each file the tests use
FILES = {
    "keda.sh_scaledobjects.yaml": (*KEDA, "config/crd/bases/keda.sh_scaledobjects.yaml"),
    "keda_externalscaler.proto": (*KEDA, "pkg/scalers/externalscaler/externalscaler.proto"),
    "karpenter.sh_nodepools.yaml": (*KARPENTER, "pkg/apis/crds/karpenter.sh_nodepools.yaml"),
    "karpenter.k8s.aws_ec2nodeclasses.yaml": (*KARPENTER_AWS, "pkg/apis/crds/karpenter.k8s.aws_ec2nodeclasses.yaml"),
    "monitoring.coreos.com_podmonitors.yaml":
        (*PROMETHEUS_OPERATOR, "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml"),
    "monitoring.coreos.com_servicemonitors.yaml":
        (*PROMETHEUS_OPERATOR, "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"),
}


def _escape(module: str) -> str:
    """Module path as the proxy and the module cache spell it (upper case -> '!' + lower)."""
    return re.sub(r"[A-Z]", lambda m: "!" + m.group(0).lower(), module)


def _gomodcache() -> Path | None:
    env = os.environ.get("GOMODCACHE")
    if env:
        return Path(env)
    try:
        out = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out) if out else None


def _proxy() -> str:
    for entry in re.split(r"[,|]", os.environ.get("GOPROXY", "")):
        if entry.startswith(("https://", "http://")):
            return entry.rstrip("/")
    return "https://proxy.golang.org"


def module_file(module: str, version: str, path: str) -> Path:
    """Local path of ``path`` inside ``module@version`` (fetched on first use). Raises
    FileNotFoundError, saying where it looked, when no source has it."""
    cached = CACHE / "modules" / f"{_escape(module)}@{version}" / path
    if cached.is_file():
        return cached
    gomod = _gomodcache()
    if gomod and (gomod / f"{_escape(module)}@{version}" / path).is_file():
        return gomod / f"{_escape(module)}@{version}" / path
    url = f"{_proxy()}/{_escape(module)}/@v/{version}.zip"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            data = resp.read()
    except OSError as exc:
        raise FileNotFoundError(f"{module}@{version}/{path}: not in {CACHE / 'modules'} nor Go's module cache, "
                                f"and {url} could not be fetched: {exc}") from exc
    prefix = f"{module}@{version}/"
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        try:
            body = zf.read(prefix + path)
        except KeyError:
            raise FileNotFoundError(f"{url} has no {path}") from None
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    tmp.write_bytes(body)
    os.replace(tmp, cached)
    return cached


def upstream_file(name: str) -> Path:
    """One of :data:`FILES` by its short name."""
    module, key, path = FILES[name]
    return module_file(module, versions()[key], path)
