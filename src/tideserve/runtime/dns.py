"""Replica discovery through DNS: each pool's headless Service resolves to its ready pods.

A headless Service (``clusterIP: None``) without ``publishNotReadyAddresses`` publishes one
A/AAAA record per *ready* endpoint, so resolving its name every ``interval_s`` gives the pool's
ready replicas as they come and go (Kubernetes docs, "DNS for Services and Pods"). The names
come from the caller (the CLI builds them with ``tideserve.k8s.names.worker_dns``), so this
module knows nothing of Kubernetes objects.

Resolution uses the event loop's ``getaddrinfo`` (a thread, never blocking the loop); tests
inject a resolver. "No such name" / "no data" means the pool has no ready pod (a headless
Service with no ready endpoint has no records); any other failure (timeout, server failure)
keeps the last known addresses and is reported in ``errors``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping

from tideserve.aio import cancel_and_wait

log = logging.getLogger("tideserve.discovery")

#: ``resolver(host, port) -> addresses`` (IPv4/IPv6 literals). Raises ``LookupError`` for a
#: temporary failure; returns [] when the name has no addresses.
Resolver = Callable[[str, int], Awaitable[list[str]]]
#: ``on_change(pool, urls)``: the pool's replica base URLs now (sorted, possibly empty).
OnChange = Callable[[str, list[str]], None]
#: ``on_error(pool, reason)``: resolving the pool's name failed (reason) or works again (None).
OnError = Callable[[str, "str | None"], None]

_NO_ADDRESS = {socket.EAI_NONAME} | ({socket.EAI_NODATA} if hasattr(socket, "EAI_NODATA") else set())


async def getaddrinfo_resolver(host: str, port: int) -> list[str]:
    """Addresses of ``host`` through the running loop's ``getaddrinfo`` (sorted, unique).
    Returns [] when the name does not exist or has no address; raises LookupError otherwise."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NO_ADDRESS:
            return []
        raise LookupError(f"cannot resolve {host}: {exc.strerror or exc}") from None
    return sorted({str(info[4][0]) for info in infos})


def replica_url(address: str, port: int) -> str:
    """``http://address:port``, with IPv6 literals in brackets."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


class DnsDiscovery:
    """Resolve each pool's host name every ``interval_s``; call ``on_change(pool, urls)`` when a
    pool's set of replica URLs differs from the last one reported (and once at the start).

    ``hosts``: pool -> DNS name; ``port``: the workers' port; ``on_error`` hears of failed
    lookups (the last addresses are kept meanwhile) and of their recovery.
    """

    def __init__(self, hosts: Mapping[str, str], port: int, on_change: OnChange,
                 resolver: Resolver = getaddrinfo_resolver, interval_s: float = 2.0,
                 on_error: OnError | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.hosts = dict(hosts)
        self.port = port
        self.on_change = on_change
        self.resolver = resolver
        self.on_error = on_error
        self.interval_s = interval_s
        self.known: dict[str, list[str]] = {}
        self.errors: dict[str, str] = {}
        self._task: asyncio.Task | None = None

    async def poll_once(self) -> None:
        """Resolve every pool once (concurrently) and report the pools whose URLs changed."""
        pools = list(self.hosts)
        results = await asyncio.gather(*(self.resolver(self.hosts[p], self.port) for p in pools),
                                       return_exceptions=True)
        for pool, res in zip(pools, results, strict=True):
            if isinstance(res, BaseException):
                if isinstance(res, asyncio.CancelledError):
                    raise res
                msg = f"{self.hosts[pool]}: {res}"
                if self.errors.get(pool) != msg:
                    log.warning("replica discovery failed, keeping the last addresses", extra={"pool": pool, "error": msg})
                    if self.on_error is not None:
                        self.on_error(pool, msg)
                self.errors[pool] = msg
                continue
            if self.errors.pop(pool, None) is not None and self.on_error is not None:
                self.on_error(pool, None)
            urls = sorted(replica_url(a, self.port) for a in set(res))
            if self.known.get(pool) != urls:
                self.known[pool] = urls
                log.info("replicas discovered", extra={"pool": pool, "replicas": urls})
                self.on_change(pool, urls)

    async def run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:
                log.exception("replica discovery round failed")
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="dns-discovery")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
