"""A real Kubernetes control plane on loopback, from the binaries scripts/k8s/build.sh puts in
the cache (``$TIDESERVE_K8S_CACHE``, default ~/.cache/tideserve-k8s/<piece>-<version>/):

* etcd; kube-apiserver (RBAC, Pod Security admission, the API aggregator); kube-controller-manager
  (Deployments, ReplicaSets, garbage collector, HPA, PV binding, service accounts); kube-scheduler;
* kwok, which plays the kubelet of every node annotated ``kwok.x-k8s.io/node=fake`` (nodes Ready
  with leases; pods Running and Ready once bound; deleted pods removed), with kwok's own "fast"
  stages from its Go module;
* Karpenter's kwok provider (Karpenter's real provisioning and disruption controllers; its "cloud"
  creates kwok Nodes of the instance types the test gives);
* KEDA's operator and its metrics adapter (registered as the ``external.metrics.k8s.io``
  APIService).

Everything listens on 127.0.0.1. The aggregator reaches the adapter through the API server's
egress selector: a CONNECT proxy on loopback (:class:`ClusterNetwork`) maps Service cluster IPs
to loopback ports, standing in for the cluster network. Each piece is started on its own; one
that is missing or fails to start is recorded in :attr:`LocalCluster.problems` with the reason
(and its log tail), and the others still run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kube import Kube
from pki import CA, service_account_keys
from upstream import CACHE, module_file, versions

HOST = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
ADAPTER_STAND_IN_IP = "10.244.255.254"  # KEDA's adapter's endpoint as the API server sees it (ClusterNetwork)
START_TIMEOUT_S = float(os.environ.get("TIDESERVE_K8S_START_TIMEOUT_S", "180"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def piece_dir(piece: str) -> Path:
    key = {"etcd": "ETCD_VERSION", "kube": "KUBE_VERSION", "kwok": "KWOK_VERSION", "karpenter": "KARPENTER_VERSION",
           "keda": "KEDA_VERSION", "helm": "HELM_VERSION"}[piece]
    return CACHE / f"{piece}-{versions()[key]}"


def binary(piece: str, name: str) -> tuple[Path | None, str]:
    """(path, "") when built; (None, why) when not."""
    d = piece_dir(piece)
    if (d / "OK").is_file() and (d / name).is_file():
        return d / name, ""
    if (d / "FAILED").is_file():
        return None, f"{piece} failed to build: {(d / 'FAILED').read_text().strip()}"
    return None, f"{piece} is not built ({d} has no OK marker): run scripts/k8s/build.sh {piece}"


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen | None = None

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        fh = self.log.open("ab")
        env = {**os.environ, **self.env}
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(k, None)
        self.popen = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        fh.close()
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, n: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        p = self.popen
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


class ClusterNetwork:
    """An HTTP CONNECT proxy on a Unix socket: the API server's egress for the "cluster" network
    (aggregated APIs; the egress selector's TCP transport requires TLS, its UDS one does not).
    ``routes`` maps ``host:port`` (a Service's cluster IP and port) to a loopback port; anything
    else is refused."""

    def __init__(self, path: Path) -> None:
        self.routes: dict[str, int] = {}
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(64)
        self._stop = False
        self.seen: list[str] = []
        threading.Thread(target=self._serve, daemon=True, name="cluster-network").start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        try:
            data = b""
            while b"\r\n\r\n" not in data and len(data) < 8192:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            line = data.split(b"\r\n", 1)[0].decode(errors="replace").split()
            target = line[1] if len(line) >= 2 and line[0] == "CONNECT" else ""
            self.seen.append(target)
            port = self.routes.get(target)
            if port is None:
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
                return
            upstream = socket.create_connection((HOST, port), timeout=10)
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            conn.settimeout(None)
            upstream.settimeout(None)
            rest = data.split(b"\r\n\r\n", 1)[1]
            if rest:
                upstream.sendall(rest)

            def pump(a: socket.socket, b: socket.socket) -> None:
                try:
                    while True:
                        buf = a.recv(65536)
                        if not buf:
                            break
                        b.sendall(buf)
                except OSError:
                    pass
                finally:
                    for s in (a, b):
                        with contextlib.suppress(OSError):
                            s.shutdown(socket.SHUT_RDWR)

            t = threading.Thread(target=pump, args=(upstream, conn), daemon=True)
            t.start()
            pump(conn, upstream)
            t.join(5)
            upstream.close()
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._sock.close()


def _kubeconfig(path: Path, server: str, ca: Path, *, cert: tuple[Path, Path] | None = None,
                token: str | None = None, namespace: str | None = None) -> Path:
    user: dict = {"client-certificate": str(cert[0]), "client-key": str(cert[1])} if cert else {"token": token}
    ctx: dict = {"cluster": "local", "user": "user"}
    if namespace:
        ctx["namespace"] = namespace
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "local", "context": ctx}],
    }))
    return path


KWOK_STAGES = ["kustomize/stage/node/fast/node-initialize.yaml",
               "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
               "kustomize/stage/pod/fast/pod-ready.yaml", "kustomize/stage/pod/fast/pod-complete.yaml",
               "kustomize/stage/pod/fast/pod-delete.yaml"]
KARPENTER_CRDS = ["kwok/charts/crds/karpenter.sh_nodepools.yaml", "kwok/charts/crds/karpenter.sh_nodeclaims.yaml",
                  "kwok/charts/crds/karpenter.sh_nodeoverlays.yaml",
                  "kwok/charts/crds/autoscaling.x-k8s.io_capacitybuffers.yaml",
                  "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml"]
KEDA_CRDS = ["config/crd/bases/keda.sh_scaledobjects.yaml", "config/crd/bases/keda.sh_scaledjobs.yaml",
             "config/crd/bases/keda.sh_triggerauthentications.yaml",
             "config/crd/bases/keda.sh_clustertriggerauthentications.yaml",
             "config/crd/bases/eventing.keda.sh_cloudeventsources.yaml",
             "config/crd/bases/eventing.keda.sh_clustercloudeventsources.yaml"]
PROMETHEUS_CRDS = ["example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
                   "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"]


class LocalCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.pki = root / "pki"
        self.pki.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, Proc] = {}
        self.problems: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self.network = ClusterNetwork(root / "cluster-network.sock")
        self.api_port = free_port()
        self.server = f"https://{HOST}:{self.api_port}"
        self.kube: Kube | None = None

    # -- helpers ---------------------------------------------------------------------------------
    def note(self, piece: str, why: str) -> None:
        self.problems[piece] = why

    def _proc(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        p = Proc(name, argv, self.root / "logs" / f"{name}.log", env or {}).start()
        self.procs[name] = p
        return p

    def _wait(self, name: str, what: str, fn, timeout_s: float = START_TIMEOUT_S):
        p = self.procs[name]

        def check():
            if not p.alive():
                raise RuntimeError(f"{name} exited with {p.popen.returncode}:\n{p.tail()}")
            return fn()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                v = check()
                if v:
                    return v
            except RuntimeError:
                raise
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: no {what} after {timeout_s:.0f}s:\n{p.tail()}")
            time.sleep(0.3)

    def _timed(self, piece: str, fn) -> bool:
        t0 = time.monotonic()
        try:
            fn()
        except Exception as exc:
            self.note(piece, f"{type(exc).__name__}: {exc}")
            return False
        self.timings[piece] = time.monotonic() - t0
        return True

    def ok(self, piece: str) -> bool:
        return piece in self.timings and piece not in self.problems

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> None:
        if not self._timed("pki", self._pki):
            return
        if not self._timed("etcd", self._etcd) or not self._timed("kube-apiserver", self._apiserver):
            return
        self._timed("kube-controller-manager", self._controller_manager)
        self._timed("kube-scheduler", self._scheduler)
        self._timed("crds", self._crds)
        self._timed("kwok", self._kwok)
        self._timed("karpenter", self._karpenter)
        self._timed("keda", self._keda)
        self._timed("keda-adapter", self._keda_adapter)

    def _pki(self) -> None:
        ca = CA.create(self.pki, "ca")
        self.ca = ca.cert_path
        self.serving = ca.issue(self.pki, "apiserver", cn="kube-apiserver", server=True,
                                hosts=(HOST, "localhost", "10.96.0.1", "kubernetes", "kubernetes.default.svc"))
        self.admin_cert = ca.issue(self.pki, "admin", cn="tests-admin", orgs=("system:masters",), client=True)
        fp = CA.create(self.pki, "front-proxy-ca")
        self.front_proxy_ca = fp.cert_path
        self.front_proxy = fp.issue(self.pki, "front-proxy-client", cn="front-proxy-client", client=True)
        self.sa_key, self.sa_pub = service_account_keys(self.pki)
        keda_dir = self.pki / "keda"
        keda_dir.mkdir(exist_ok=True)
        kca = CA.create(keda_dir, "keda-ca")
        shutil.copy(kca.cert_path, keda_dir / "ca.crt")
        crt, key = kca.issue(keda_dir, "keda", cn="keda", server=True, client=True,
                             hosts=(HOST, "localhost", "keda-operator.keda.svc", "keda-operator.keda.svc.cluster.local",
                                    "keda-operator-metrics-apiserver.keda.svc"))
        shutil.copy(crt, keda_dir / "tls.crt")
        shutil.copy(key, keda_dir / "tls.key")
        self.keda_certs = keda_dir
        self.admin_kubeconfig = _kubeconfig(self.root / "admin.kubeconfig", self.server, self.ca, cert=self.admin_cert)

    def _etcd(self) -> None:
        etcd, why = binary("etcd", "etcd")
        if etcd is None:
            raise RuntimeError(why)
        self.etcd_port, peer = free_port(), free_port()
        self._proc("etcd", [str(etcd), "--name=e2e", f"--data-dir={self.root / 'etcd'}",
                            f"--listen-client-urls=http://{HOST}:{self.etcd_port}",
                            f"--advertise-client-urls=http://{HOST}:{self.etcd_port}",
                            f"--listen-peer-urls=http://{HOST}:{peer}",
                            f"--initial-advertise-peer-urls=http://{HOST}:{peer}",
                            f"--initial-cluster=e2e=http://{HOST}:{peer}", "--unsafe-no-fsync=true",
                            "--log-level=warn"])
        import httpx
        self._wait("etcd", "health", lambda: httpx.get(f"http://{HOST}:{self.etcd_port}/health", timeout=2).json()
                   .get("health") == "true")

    def _apiserver(self) -> None:
        kas, why = binary("kube", "kube-apiserver")
        if kas is None:
            raise RuntimeError(why)
        egress = self.root / "egress.yaml"
        egress.write_text(yaml.safe_dump({
            "apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
            "egressSelections": [{"name": "cluster", "connection": {
                "proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": str(self.network.path)}}}}],
        }))
        self._proc("kube-apiserver", [
            str(kas), f"--etcd-servers=http://{HOST}:{self.etcd_port}", f"--bind-address={HOST}",
            f"--advertise-address={HOST}", f"--secure-port={self.api_port}",
            f"--tls-cert-file={self.serving[0]}", f"--tls-private-key-file={self.serving[1]}",
            f"--client-ca-file={self.ca}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa_pub}", f"--service-account-signing-key-file={self.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=RBAC",
            "--endpoint-reconciler-type=none", "--allow-privileged=false", "--profiling=false",
            f"--requestheader-client-ca-file={self.front_proxy_ca}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy[0]}", f"--proxy-client-key-file={self.front_proxy[1]}",
            f"--egress-selector-config-file={egress}",
        ])
        self.kube = Kube(self.server, str(self.ca), cert=(str(self.admin_cert[0]), str(self.admin_cert[1])))
        self._wait("kube-apiserver", "/readyz", lambda: self.kube.http.get("/readyz").status_code == 200)

    def _controller_manager(self) -> None:
        kcm, why = binary("kube", "kube-controller-manager")
        if kcm is None:
            raise RuntimeError(why)
        port = free_port()
        self._proc("kube-controller-manager", [
            str(kcm), f"--kubeconfig={self.admin_kubeconfig}", f"--authentication-kubeconfig={self.admin_kubeconfig}",
            f"--authorization-kubeconfig={self.admin_kubeconfig}", f"--bind-address={HOST}", f"--secure-port={port}",
            "--leader-elect=false", f"--service-account-private-key-file={self.sa_key}", f"--root-ca-file={self.ca}",
            "--use-service-account-credentials=false", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--horizontal-pod-autoscaler-sync-period=5s", "--controllers=*,-nodeipam,-bootstrapsigner,-tokencleaner",
            "--concurrent-gc-syncs=5",
        ])
        self._wait("kube-controller-manager", "the default ServiceAccount",
                   lambda: self.kube.get("v1", "ServiceAccount", "default", "default"))

    def _scheduler(self) -> None:
        ks, why = binary("kube", "kube-scheduler")
        if ks is None:
            raise RuntimeError(why)
        port = free_port()
        self._proc("kube-scheduler", [
            str(ks), f"--kubeconfig={self.admin_kubeconfig}", f"--authentication-kubeconfig={self.admin_kubeconfig}",
            f"--authorization-kubeconfig={self.admin_kubeconfig}", f"--bind-address={HOST}", f"--secure-port={port}",
            "--leader-elect=false",
        ])
        import httpx
        self._wait("kube-scheduler", "/healthz",
                   lambda: httpx.get(f"https://{HOST}:{port}/healthz", verify=False, timeout=2).status_code == 200)

    def _crds(self) -> None:
        """KEDA's, Karpenter's (kwok provider: NodePool, NodeClaim, KWOKNodeClass...) and the Prometheus
        operator's CRDs, from their Go modules at the versions built."""
        v = versions()
        files = [module_file("github.com/kedacore/keda/v2", v["KEDA_VERSION"], p) for p in KEDA_CRDS]
        files += [module_file("sigs.k8s.io/karpenter", v["KARPENTER_VERSION"], p) for p in KARPENTER_CRDS]
        files += [module_file("github.com/prometheus-operator/prometheus-operator", v["PROMETHEUS_OPERATOR_VERSION"], p)
                  for p in PROMETHEUS_CRDS]
        names = []
        for f in files:
            for doc in yaml.safe_load_all(f.read_text()):
                if doc:
                    self.kube.apply(doc)
                    names.append(doc["metadata"]["name"])
        for n in names:
            self.kube.wait_crd(n)

    def _kwok(self) -> None:
        kwok, why = binary("kwok", "kwok")
        if kwok is None:
            raise RuntimeError(why)
        stages = [module_file("sigs.k8s.io/kwok", versions()["KWOK_VERSION"], p).read_text() for p in KWOK_STAGES]
        cfg = self.root / "kwok.yaml"
        cfg.write_text("\n---\n".join(stages))
        self._proc("kwok", [
            str(kwok), f"--kubeconfig={self.admin_kubeconfig}", f"--config={cfg}", "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-lease-duration-seconds=40", "--cidr=10.244.0.1/16", "--node-ip=10.244.0.1",
            f"--server-address={HOST}:{free_port()}",
        ])
        # a plain CPU node for the gateway (not Karpenter's; the GPU NodePools are tainted)
        self.kube.apply({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": "system-0", "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": "system-0", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "type": "kwok", "tideserve.test/role": "system"}},
            "spec": {}})
        self.kube.request("PATCH", "/api/v1/nodes/system-0/status", content_type="application/merge-patch+json", body={
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"}}})

        def node_ready():
            n = self.kube.get("v1", "Node", "system-0")
            return any(c["type"] == "Ready" and c["status"] == "True" for c in (n.get("status") or {}).get("conditions") or [])
        self._wait("kwok", "node system-0 Ready", node_ready, timeout_s=60)

    def _karpenter(self) -> None:
        kp, why = binary("karpenter", "karpenter-kwok")
        if kp is None:
            raise RuntimeError(why)
        types = self.root / "instance-types.json"
        types.write_text(__import__("json").dumps(INSTANCE_TYPES, indent=1))
        self.karpenter_metrics, probe = free_port(), free_port()
        self._proc("karpenter", [str(kp)], env={
            "KUBECONFIG": str(self.admin_kubeconfig), "INSTANCE_TYPES_FILE_PATH": str(types),
            "SYSTEM_NAMESPACE": "kube-system", "DISABLE_LEADER_ELECTION": "true", "LEADER_ELECT": "false",
            "METRICS_PORT": str(self.karpenter_metrics), "HEALTH_PROBE_PORT": str(probe),
            "LOG_LEVEL": "debug", "BATCH_IDLE_DURATION": "1s", "BATCH_MAX_DURATION": "3s",
            "KUBERNETES_MIN_VERSION": "1.19.0", "CLUSTER_NAME": "tests", "DISABLE_WEBHOOK": "true",
        })
        import httpx
        self._wait("karpenter", "/readyz", lambda: httpx.get(f"http://{HOST}:{probe}/readyz", timeout=2).status_code == 200,
                   timeout_s=90)

    def _keda(self) -> None:
        op, why = binary("keda", "operator")
        if op is None:
            raise RuntimeError(why)
        self.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "keda"}})
        self.keda_grpc, probe = free_port(), free_port()
        self._proc("keda-operator", [
            str(op), "--leader-elect=false", f"--metrics-bind-address={HOST}:{free_port()}",
            f"--health-probe-bind-address={HOST}:{probe}", f"--metrics-service-bind-address={HOST}:{self.keda_grpc}",
            f"--cert-dir={self.keda_certs}", "--enable-cert-rotation=false", "--enable-webhook-patching=false",
            "--enable-apiservice-patching=false", f"--kubeconfig={self.admin_kubeconfig}", "--zap-log-level=info",
            f"--ca-dir={self.keda_certs}",
        ], env={"WATCH_NAMESPACE": "", "POD_NAMESPACE": "keda", "KEDA_CLUSTER_OBJECT_NAMESPACE": "keda",
                "OPERATOR_NAME": "keda-operator", "KUBECONFIG": str(self.admin_kubeconfig)})
        import httpx
        self._wait("keda-operator", "/readyz", lambda: httpx.get(f"http://{HOST}:{probe}/readyz", timeout=2).status_code == 200,
                   timeout_s=90)

    def _keda_adapter(self) -> None:
        ad, why = binary("keda", "adapter")
        if ad is None:
            raise RuntimeError(why)
        if not self.ok("keda"):
            raise RuntimeError("KEDA's operator is not running, the adapter has nothing to ask")
        self.adapter_port = free_port()
        self._proc("keda-adapter", [
            str(ad), f"--secure-port={self.adapter_port}", f"--bind-address={HOST}",
            f"--tls-cert-file={self.keda_certs / 'tls.crt'}", f"--tls-private-key-file={self.keda_certs / 'tls.key'}",
            f"--cert-dir={self.keda_certs}", f"--kubeconfig={self.admin_kubeconfig}",
            f"--authentication-kubeconfig={self.admin_kubeconfig}", f"--authorization-kubeconfig={self.admin_kubeconfig}",
            f"--lister-kubeconfig={self.admin_kubeconfig}",
            f"--metrics-service-address={HOST}:{self.keda_grpc}", "--metrics-service-grpc-authority=localhost",
            f"--port={free_port()}",
        ], env={"WATCH_NAMESPACE": "", "POD_NAMESPACE": "keda", "KEDA_CLUSTER_OBJECT_NAMESPACE": "keda",
                "KUBECONFIG": str(self.admin_kubeconfig)})
        # The Service the APIService names; its cluster IP is routed to the adapter by ClusterNetwork.
        svc = self.kube.apply({"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": "keda-operator-metrics-apiserver", "namespace": "keda"},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 6443}]}})
        self.network.routes[f"{svc['spec']['clusterIP']}:443"] = self.adapter_port
        # The aggregator's availability check wants an endpoint (no loopback address is allowed
        # there): a stand-in address, routed to the adapter as well.
        self.kube.apply({"apiVersion": "v1", "kind": "Endpoints", "metadata": {
            "name": "keda-operator-metrics-apiserver", "namespace": "keda"},
            "subsets": [{"addresses": [{"ip": ADAPTER_STAND_IN_IP}], "ports": [{"name": "https", "port": 6443}]}]})
        self.network.routes[f"{ADAPTER_STAND_IN_IP}:6443"] = self.adapter_port
        self.kube.apply({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                         "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
                         "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                                  "versionPriority": 100, "insecureSkipTLSVerify": True,
                                  "service": {"name": "keda-operator-metrics-apiserver", "namespace": "keda", "port": 443}}})

        def available():
            a = self.kube.get("apiregistration.k8s.io/v1", "APIService", "v1beta1.external.metrics.k8s.io")
            return any(c["type"] == "Available" and c["status"] == "True"
                       for c in ((a or {}).get("status") or {}).get("conditions") or [])
        try:
            self._wait("keda-adapter", "APIService v1beta1.external.metrics.k8s.io Available", available, timeout_s=120)
        except RuntimeError as exc:
            a = self.kube.get("apiregistration.k8s.io/v1", "APIService", "v1beta1.external.metrics.k8s.io")
            raise RuntimeError(f"{exc}\nAPIService status: {(a or {}).get('status')}; "
                               f"CONNECT targets seen: {self.network.seen[-5:]}") from None

    # -- service-account credentials ---------------------------------------------------------------
    def token_kubeconfig(self, namespace: str, service_account: str, path: Path) -> tuple[Path, str]:
        """A kubeconfig with a bound token of ``namespace/service_account`` (TokenRequest API)."""
        tr = self.kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                               body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": 7200}})
        token = tr["status"]["token"]
        return _kubeconfig(path, self.server, self.ca, token=token), token

    # -- stop ------------------------------------------------------------------------------------
    def stop(self) -> None:
        order = ["keda-adapter", "keda-operator", "karpenter", "kwok", "kube-scheduler", "kube-controller-manager",
                 "kube-apiserver", "etcd"]
        for name in [n for n in self.procs if n not in order] + order:
            if name in self.procs:
                self.procs[name].stop()
        if self.kube:
            self.kube.close()
        self.network.close()

    def report(self) -> str:
        lines = [f"  {k}: started in {v:.1f}s" for k, v in self.timings.items()]
        lines += [f"  {k}: NOT RUNNING: {v}" for k, v in self.problems.items()]
        return "\n".join(lines)


def require(cluster: LocalCluster, *pieces: str) -> None:
    missing = [f"{p}: {cluster.problems.get(p, 'not started')}" for p in pieces if not cluster.ok(p)]
    if missing:
        msg = "needs pieces that are not running:\n  " + "\n  ".join(missing)
        if os.environ.get("TIDESERVE_K8S_ALLOW_MISSING") == "1":
            pytest.skip(msg)
        pytest.fail(msg, pytrace=False)


def _gpu_type(name: str, cpu: str, memory: str, gpu_name: str, family: str, prices: tuple[float, float]) -> dict:
    offerings = []
    for capacity, price in zip(("spot", "on-demand"), prices, strict=True):
        offerings.append({"Price": price, "Available": True, "Requirements": [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [capacity]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]},
            {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": [gpu_name]},
            {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": [family]},
        ]})
    return {"name": name, "offerings": offerings, "architecture": "amd64", "operatingSystems": ["linux"],
            "resources": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": "1", "pods": "58"}}


#: GPU instance types for Karpenter's kwok "cloud" (EC2 names and GPUs; prices: on-demand from
#: the catalog's us-east-1 figures, spot a round 40% of it; only their order matters here)
INSTANCE_TYPES = [
    _gpu_type("g5.xlarge", "4", "16Gi", "a10g", "g5", (0.4024, 1.006)),
    _gpu_type("g5.2xlarge", "8", "32Gi", "a10g", "g5", (0.4848, 1.212)),
    _gpu_type("g6e.xlarge", "4", "32Gi", "l40s", "g6e", (0.7444, 1.861)),
]
