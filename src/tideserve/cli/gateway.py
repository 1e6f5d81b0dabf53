"""``tideserve gateway``: the gateway alone, in Kubernetes mode.

Composition: the same gateway app, dispatcher and autoscaler (policy and control loop) as
embedded mode, with a ``DiscoveredRuntime`` instead of the local one. Replicas come from DNS
(each pool's headless Service, ``tideserve.k8s.names.worker_dns``) or, for tests, a static
list; the autoscaler's decisions are recorded, not acted on, and the KEDA external scaler
(``tideserve.gateway.scaler``) publishes them so KEDA and the HPA scale each pool's Deployment.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence

from aiohttp import web

from tideserve.autoscaler.loop import Autoscaler
from tideserve.autoscaler.policy import place
from tideserve.files import write_atomic
from tideserve.gateway.app import build_gateway_app
from tideserve.gateway.dispatch import Dispatcher
from tideserve.gateway.grpc_server import InferenceGrpcServer
from tideserve.gateway.scaler import ExternalScaler, ScalerServer
from tideserve.httpguard import GuardedAppRunner
from tideserve.k8s.names import WORKER_PORT, worker_dns
from tideserve.runtime.discovered import DiscoveredRuntime
from tideserve.runtime.dns import DnsDiscovery, Resolver, getaddrinfo_resolver
from tideserve.spec import InferenceEndpoint

log = logging.getLogger("tideserve.gateway")
WORKER_TOKEN_ENV = "TIDESERVE_WORKER_TOKEN"


class _ScalingView:
    """The external scaler's view: the recorded decision, and held requests per pool."""

    def __init__(self, endpoint: InferenceEndpoint, runtime: DiscoveredRuntime, dispatcher: Dispatcher,
                 autoscaler: Autoscaler) -> None:
        self.endpoint = endpoint.metadata.name
        self._pools = [p.name for p in endpoint.spec.pools]
        self.runtime = runtime
        self.dispatcher = dispatcher
        self.autoscaler = autoscaler

    def pools(self) -> Sequence[str]:
        return self._pools

    def desired(self, pool: str) -> int:
        return self.runtime.desired(pool)

    def held_for(self, pool: str) -> bool:
        # Held requests activate the pool the policy's placement fills first (mins, then the
        # cheapest per unit of service rate), so KEDA wakes one pool, not all of them.
        if self.dispatcher.pending <= 0:
            return False
        snap = self.autoscaler.snapshot()
        return place(1, snap.pools, snap.slots).get(pool, 0) > 0


@dataclass
class KubeGateway:
    endpoint: InferenceEndpoint
    runtime: DiscoveredRuntime
    app: web.Application
    dispatcher: Dispatcher
    autoscaler: Autoscaler
    scaler: ExternalScaler
    server: ScalerServer
    discovery: DnsDiscovery | None
    runner: web.AppRunner | None = None
    http_port: int | None = None
    scaler_port: int | None = None
    grpc: InferenceGrpcServer | None = None
    grpc_port: int | None = None

    async def start(self, host: str, port: int, scaler_port: int, autoscale: bool = True) -> None:
        """Listen for HTTP on ``host:port`` and gRPC on ``host:scaler_port`` (0: any free
        port; the bound ones are in ``http_port``, ``scaler_port``), start discovery and,
        unless ``autoscale`` is False (tests step the autoscaler themselves), the control loop.
        Raises OSError when a port cannot be bound."""
        gw = self.endpoint.spec.gateway
        self.runner = GuardedAppRunner(self.app, handler_cancellation=True, access_log=None,
                                       shutdown_timeout=gw.request_timeout_s, header_timeout_s=gw.header_timeout_s,
                                       idle_timeout_s=gw.idle_timeout_s,
                                       max_connections_per_client=gw.max_connections_per_client)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port)
        try:
            await site.start()
            self.scaler_port = await self.server.start(host, scaler_port)
            if gw.grpc_port is not None:  # the inference protocol over gRPC (spec.gateway.grpc_port)
                self.grpc = InferenceGrpcServer(self.app["core"], gw.max_body_bytes)
                self.grpc_port = self.app["grpc_port"] = await self.grpc.start(host, gw.grpc_port)
        except OSError:
            await self.server.stop()
            await self.runner.cleanup()
            self.runner = None
            raise
        self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if self.discovery is not None:
            await self.discovery.poll_once()  # know the replicas before deciding
            self.discovery.start()
        if autoscale:
            self.autoscaler.start()

    async def stop(self) -> None:
        await self.autoscaler.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        await self.server.stop()
        if self.grpc is not None:
            await self.grpc.stop(self.endpoint.spec.gateway.request_timeout_s)
        self.runtime.stop()
        if self.runner is not None:
            await self.runner.cleanup()


def build_kube_gateway(
    endpoint: InferenceEndpoint,
    namespace: str | None,
    discovery: str = "dns",
    static_replicas: Mapping[str, Sequence[str]] | None = None,
    worker_token: str | None = None,
    api_keys: list[str] | None = None,
    resolver: Resolver = getaddrinfo_resolver,
    dns_interval_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> KubeGateway:
    """Wire the Kubernetes-mode gateway. ``discovery``: ``dns`` (each pool's
    ``worker_dns(endpoint, pool, namespace)`` on WORKER_PORT) or ``static`` (``static_replicas``:
    pool -> base URLs). Raises ValueError for an unknown discovery, a missing namespace or a
    static list naming an unknown pool."""
    name = endpoint.metadata.name
    runtime = DiscoveredRuntime(endpoint, discovery, namespace)
    dns: DnsDiscovery | None = None
    if discovery == "dns":
        if not namespace:
            raise ValueError("--namespace is required with --discovery dns (the pools' Services live there)")
        hosts = {p.name: worker_dns(name, p.name, namespace) for p in endpoint.spec.pools}

        def changed(pool: str, urls: list[str]) -> None:
            runtime.set_replicas(pool, urls)

        dns = DnsDiscovery(hosts, WORKER_PORT, changed, resolver, dns_interval_s, on_error=runtime.set_error)
    elif discovery == "static":
        for pool, urls in (static_replicas or {}).items():
            try:
                runtime.set_replicas(pool, urls)
            except KeyError as exc:
                raise ValueError(f"--replica: {exc.args[0]}") from None
    else:
        raise ValueError(f"unknown discovery '{discovery}'; use dns or static")

    autoscaler: Autoscaler | None = None
    app = build_gateway_app(endpoint, runtime, api_keys, worker_token,
                            extra_status=lambda: autoscaler.status() if autoscaler else {})
    dispatcher: Dispatcher = app["dispatcher"]
    runtime.add_listener(dispatcher.notify)
    autoscaler = Autoscaler(endpoint.spec, dispatcher, runtime, clock)
    scaler = ExternalScaler(_ScalingView(endpoint, runtime, dispatcher, autoscaler), endpoint.spec.autoscaling.target)
    server = ScalerServer(scaler)
    runtime.on_desired(scaler.notify)

    def on_hold() -> None:
        autoscaler.wake()  # decide now (activation from zero)
        scaler.notify()  # and tell KEDA's stream at once

    dispatcher.on_hold = on_hold
    return KubeGateway(endpoint, runtime, app, dispatcher, autoscaler, scaler, server, dns)


async def run_gateway(
    endpoint: InferenceEndpoint,
    namespace: str | None,
    host: str,
    port: int,
    scaler_port: int,
    discovery: str,
    static_replicas: Mapping[str, Sequence[str]] | None,
    api_keys: list[str],
    port_file: Path | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM; return the exit code (1: ``host`` does not resolve, a port
    could not be bound or ``port_file`` could not be written; 2: bad options)."""
    token = os.environ.get(WORKER_TOKEN_ENV) or None
    try:
        kg = build_kube_gateway(endpoint, namespace, discovery, static_replicas, token, api_keys)
    except ValueError as exc:
        print(f"tideserve: {exc}", file=sys.stderr)
        return 2
    try:
        await kg.start(host, port, scaler_port)
    except socket.gaierror as exc:
        await kg.stop()
        print(f"tideserve: --host {host!r} is not an address this machine can bind ({exc.strerror or exc}); "
              "give an IP address such as 0.0.0.0 or 127.0.0.1", file=sys.stderr)
        return 1
    except OSError as exc:
        await kg.stop()
        print(f"tideserve: cannot listen on {host} (HTTP port {port}, scaler port {scaler_port}): {exc}; "
              "stop what uses the port or pick another with --port / --scaler-port", file=sys.stderr)
        return 1
    if port_file:
        try:
            write_atomic(port_file, json.dumps({"port": kg.http_port, "scaler_port": kg.scaler_port}))
        except OSError as exc:
            await kg.stop()
            print(f"tideserve: cannot write --port-file {port_file}: {exc.strerror or exc}; "
                  "give a path in an existing, writable directory", file=sys.stderr)
            return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("gateway listening (Kubernetes mode)", extra={
        "endpoint": endpoint.metadata.name, "namespace": namespace, "discovery": discovery,
        "http_port": kg.http_port, "scaler_port": kg.scaler_port, "worker_token": bool(token)})
    await stop.wait()
    log.info("stopping: draining requests")
    await kg.stop()
    log.info("stopped")
    return 0
