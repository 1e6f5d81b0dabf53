"""The embedded runtime: each replica is a ``python -m tideserve.worker`` process.

Life of a replica: ``starting`` (process up, model loading) -> ``ready`` (its
``/v2/health/ready`` answered 200) -> ``draining`` -> gone. A replica that exits on its own,
fails 3 health checks in a row, or is not ready within ``ready_timeout_s`` is restarted after
a backoff that doubles from ``restart.backoff_initial_s`` up to ``restart.backoff_max_s``;
after ``restart.max_restarts`` restarts within ``restart.window_s`` its pool is marked
``failed`` with the reason (exit code and last log line) and nothing restarts any more.
A worker that exits with code 78 (engine target or model source can never work here) marks
its pool ``unschedulable`` at once, without restarts.

Workers inherit a parent-death signal (Linux ``PR_SET_PDEATHSIG``) and watch their parent
pid, so no worker outlives the runtime, even if the runtime is killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import collections
from collections import Counter
import contextlib
import ctypes
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import aiohttp

from tideserve.aio import cancel_and_wait
from tideserve.autoscaler.policy import PoolSnapshot, place
from tideserve.errors import EngineMismatchError, MissingExtraError, SourceError
from tideserve.protocol.internal import TOKEN_HEADER
from tideserve.provisioner import Node, ReplicaRequest, SpotMarket, local_node, plan_launches
from tideserve.replicas import ReplicaEndpoint
from tideserve.runtime.zygote import ForkedProcess, Zygote
from tideserve.spec import InferenceEndpoint, LocalConfig, Pool

log = logging.getLogger("tideserve.runtime")
EX_CONFIG = 78
HEALTH_FAILURES_BEFORE_RESTART = 3


def _remove_stale_run_dirs() -> None:
    """Remove temporary run directories whose `tideserve up` is gone (killed with SIGKILL, so
    it could not clean up): those with an owner.pid naming no live process."""
    for d in Path(tempfile.gettempdir()).glob("tideserve-*"):
        try:
            pid = int((d / "owner.pid").read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (OSError, ValueError):
            continue  # no owner file (not ours, or not yet written), or another user's process


async def _in_daemon_thread(fn: Callable, *args):
    """Run ``fn(*args)`` on a daemon thread: a fetch stuck on the network must not keep the
    process from exiting on SIGTERM (executor threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:  # on the loop
        if not fut.done():
            setter(value)

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:
            # Passed now (call_soon_threadsafe binds its arguments): `exc` is unset after this block.
            loop.call_soon_threadsafe(settle, fut.set_exception, exc)
        else:
            loop.call_soon_threadsafe(settle, fut.set_result, result)

    threading.Thread(target=run, name="prepare", daemon=True).start()
    return await fut


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


_REASON = re.compile(r"cannot start|error|exception", re.IGNORECASE)
_WARNING = re.compile(r"warn", re.IGNORECASE)


def reason_line(log_tail: Iterable[str]) -> str:
    """The line of a replica's last output that names why it stopped: the last one that says
    "cannot start" or names an error or exception (any case: ``ERROR`` log records,
    ``AttributeError``), skipping warnings (multiprocessing's resource_tracker warns on every
    exit after a crash); else the last line; "(no output)" for none. At most 400 characters."""
    lines = list(log_tail)
    for line in reversed(lines):
        if _REASON.search(line) and not _WARNING.search(line):
            return line[-400:]
    return lines[-1][-400:] if lines else "(no output)"


@dataclass
class Replica:
    id: str
    pool: str
    state: str = "starting"  # starting | ready | draining | restarting | stopped
    proc: asyncio.subprocess.Process | ForkedProcess | None = None
    port: int | None = None
    started_at: float = 0.0
    ready_at: float | None = None
    next_start_at: float = 0.0
    last_health_at: float = 0.0
    health_failures: int = 0
    restarts: list[float] = field(default_factory=list)
    last_exit: int | None = None
    log_tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=20))
    port_file: Path | None = None
    startup_file: Path | None = None
    spawned_at: float | None = None  # wall clock, for the cold-start phases
    startup: dict | None = None  # phase name -> seconds since spawn, once ready
    intentional_stop: bool = False
    suspect: bool = False  # the gateway failed to reach it; not routed to until a probe passes
    drain_started_at: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class PoolState:
    spec: Pool
    state: str = "running"  # running | failed | unschedulable
    reason: str = ""
    desired: int = 0
    replicas: list[Replica] = field(default_factory=list)
    next_index: int = 0
    replica_seconds_done: float = 0.0  # lifetime of this pool's replica processes that ended
    engine_dir: Path | None = None  # prepared (fetched, built, checked) before any replica starts
    prepare_failures: int = 0
    prepare_retry_at: float = 0.0


class LocalRuntime:
    """Runs an endpoint's pools as local worker processes and keeps them healthy.

    ``endpoint_file`` is passed to each worker; ``worker_token`` (if any) is handed to workers
    in ``TIDESERVE_WORKER_TOKEN`` so they only accept requests from this gateway.
    """

    def __init__(
        self,
        endpoint_file: Path,
        endpoint: InferenceEndpoint,
        config: LocalConfig,
        config_file: Path | None = None,
        worker_token: str | None = None,
        log_format: str = "json",
        tick_s: float = 0.1,
        prepare: Callable[[Pool], Path] | None = None,
    ) -> None:
        """``prepare(pool)`` returns the pool's engine directory (fetching, building and checking
        it against this device); it raises EngineMismatchError or SourceError when the pool
        can never run here, and the pool is then unschedulable. None: workers resolve it."""
        self.endpoint_file = Path(endpoint_file).resolve()
        self.endpoint = endpoint
        self.config = config
        self.config_file = config_file
        self.worker_token = worker_token
        self.log_format = log_format
        self.tick_s = tick_s
        self.prepare = prepare
        self._own_run_dir = not config.run_dir
        if self._own_run_dir:
            _remove_stale_run_dirs()
        self.run_dir = Path(config.run_dir) if config.run_dir else Path(tempfile.mkdtemp(prefix="tideserve-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "owner.pid").write_text(str(os.getpid()))
        self.pools = {p.name: PoolState(spec=p) for p in endpoint.spec.pools}
        self._listeners: list[Callable[[], None]] = []
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        self._stopping = False
        self._wake = asyncio.Event()
        self._zygote: Zygote | None = None
        self._started = False  # start() has run: pools prepared, minimum replicas launched
        self._ready_listeners: list[Callable[[str, dict], None]] = []

    # --- public API used by the gateway and the CLI ---------------------------------------
    def add_listener(self, cb: Callable[[], None]) -> None:
        self._listeners.append(cb)

    def on_replica_ready(self, cb: Callable[[str, dict], None]) -> None:
        """``cb(pool, startup phases)`` whenever a replica becomes ready (a cold start)."""
        self._ready_listeners.append(cb)

    def endpoints(self) -> list[ReplicaEndpoint]:
        out = []
        for ps in self.pools.values():
            for r in ps.replicas:
                if r.port is not None and r.state in ("starting", "ready"):
                    ready = r.state == "ready" and not r.suspect
                    out.append(ReplicaEndpoint(r.id, ps.spec.name, r.url, ready, ps.spec.max_concurrency))
        return out

    def accepting(self) -> bool:
        return not self._stopping and any(ps.state == "running" for ps in self.pools.values())

    def failure_reason(self) -> str:
        return "; ".join(f"pool {n} {ps.state}: {ps.reason}" for n, ps in self.pools.items() if ps.state != "running") or "stopping"

    def report_unreachable(self, replica_id: str) -> None:
        """The gateway could not reach this replica, or it answered that it is not ready: stop
        routing to it until a health check passes again (or it is restarted), and check it now."""
        for ps in self.pools.values():
            for r in ps.replicas:
                if r.id == replica_id and r.state == "ready":
                    r.suspect = True
                    r.last_health_at = 0.0
                    self._wake.set()
                    self._notify()

    def status(self) -> dict:
        now = time.monotonic()
        pools = []
        for ps in self.pools.values():
            pools.append({
                "name": ps.spec.name,
                "accelerator": ps.spec.accelerator,
                "target": ps.spec.target,
                "state": ps.state,
                "reason": ps.reason,
                "desired": ps.desired,
                "ready": sum(r.state == "ready" for r in ps.replicas),
                "min": ps.spec.replicas.min,
                "max": ps.spec.replicas.max,
                "max_concurrency": ps.spec.max_concurrency,
                "replica_seconds": round(ps.replica_seconds_done + sum(
                    now - r.started_at for r in ps.replicas if r.proc is not None and r.proc.returncode is None
                ), 3),
                "replicas": [
                    {
                        "id": r.id, "state": r.state, "url": r.url if r.port else None,
                        "pid": r.proc.pid if r.proc else None, "restarts": len(r.restarts),
                        "last_exit": r.last_exit,
                        "uptime_s": round(now - r.started_at, 1) if r.started_at else None,
                        "draining_for_s": round(now - r.drain_started_at, 1) if r.state == "draining" and r.drain_started_at else None,
                        "log": str(self.run_dir / f"{r.id}.log"),
                        "startup": r.startup,
                    }
                    for r in ps.replicas
                ],
            })
        zygote = "off" if self._zygote is None else self._zygote.state
        return {"runtime": "local", "started": self._started, "run_dir": str(self.run_dir), "zygote": zygote,
                "zygote_pid": self._zygote.pid if self._zygote is not None else None, "pools": pools}

    def scrape_targets(self) -> list[dict]:
        """Prometheus HTTP service discovery: one target group per ready or starting replica."""
        ep = self.endpoint.metadata.name
        return [
            {"targets": [e.url.removeprefix("http://")], "labels": {"endpoint": ep, "pool": e.pool, "replica": e.id}}
            for e in self.endpoints()
        ]

    # --- the autoscaler's actuator --------------------------------------------------------
    def replica_states(self) -> dict[str, list[tuple[str, str]]]:
        """Per pool, ``(replica id, state)`` of every replica not draining or stopped."""
        return {
            n: [(r.id, r.state) for r in ps.replicas if r.state in ("starting", "ready", "restarting")]
            for n, ps in self.pools.items()
        }

    def schedulable(self, pool: str) -> bool:
        return self.pools[pool].state == "running"

    def slots(self) -> int | None:
        return self.config.replica_slots

    async def apply(self, desired: Mapping[str, int], drain: Sequence[str]) -> None:
        """Drain the named replicas, then start replicas until each pool has ``desired``
        (within replica_slots). Draining: the gateway stops routing to the replica at once;
        the worker finishes its in-flight and queued work, then exits."""
        if self._stopping:
            return
        for rid in drain:
            self._drain(rid)
        wanted = []
        for name, n in desired.items():
            ps = self.pools[name]
            ps.desired = n
            have = sum(1 for r in ps.replicas if r.state in ("starting", "ready", "restarting"))
            if ps.state == "running" and n > have and await self._prepare(ps):
                wanted.append(ReplicaRequest(pool=name, accelerator="cpu", count=n - have))
        # This machine is one node with replica_slots slots (draining replicas still hold theirs).
        plan = plan_launches(wanted, offerings=(), market=SpotMarket(), existing=[self._local_node()])
        placed = Counter(pool for _, pools in plan.on_existing for pool in pools)
        for name, ps in self.pools.items():
            for _ in range(placed.get(name, 0)):
                await self._spawn(ps, self._new_replica(ps))
            short = sum(k for pool, k, _ in plan.unplaceable if pool == name)
            if short:
                ps.reason = (f"{short} replica(s) waiting for a free slot: replica_slots={self.config.replica_slots} "
                             "on this machine are all in use")
            elif ps.reason.endswith("are all in use"):
                ps.reason = ""
        self._notify()

    async def _prepare(self, ps: PoolState) -> bool:
        """Make sure the pool's engine is ready to load. False when it is not: the pool is
        unschedulable (it can never run here), or a retryable fetch failed and is retried later."""
        if self.prepare is None or ps.engine_dir is not None:
            return True
        if time.monotonic() < ps.prepare_retry_at:
            return False
        previous = ps.reason
        ps.reason = f"preparing the engine (fetching {self.endpoint.spec.model.source} if needed)"
        try:
            ps.engine_dir = await _in_daemon_thread(self.prepare, ps.spec)
        except SourceError as exc:
            if not exc.retryable:
                return self._unschedulable(ps, exc)
            # Network or integrity trouble may pass: try again later, the pool stays running.
            ps.prepare_failures += 1
            delay = self._backoff(ps.prepare_failures)
            ps.prepare_retry_at = time.monotonic() + delay
            ps.reason = f"fetching the model failed ({exc}); retrying in {delay:.0f} s"
            log.warning("pool %s: %s", ps.spec.name, ps.reason, extra={"pool": ps.spec.name})
            return False
        except (EngineMismatchError, MissingExtraError) as exc:
            return self._unschedulable(ps, exc)
        except Exception as exc:
            log.debug("preparing pool %s failed", ps.spec.name, exc_info=True)
            return self._unschedulable(ps, f"cannot prepare the engine: {type(exc).__name__}: {exc}")
        ps.prepare_failures = 0
        ps.reason = "" if previous.startswith("fetching the model failed") else previous
        log.info("engine ready", extra={"pool": ps.spec.name, "engine": str(ps.engine_dir)})
        return True

    def _unschedulable(self, ps: PoolState, exc: Exception | str) -> bool:
        ps.state, ps.reason = "unschedulable", str(exc)
        log.error("pool %s is unschedulable: %s", ps.spec.name, exc, extra={"pool": ps.spec.name})
        self._notify()
        return False

    def _local_node(self) -> Node:
        held = tuple(
            r.pool for ps in self.pools.values() for r in ps.replicas
            if r.state in ("starting", "ready", "restarting", "draining")
        )
        return Node("local", local_node(self.config.replica_slots), "on-demand", held, launched_at=None)

    def _drain(self, replica_id: str) -> None:
        for ps in self.pools.values():
            for r in ps.replicas:
                if r.id != replica_id or r.state not in ("starting", "ready", "restarting"):
                    continue
                if r.proc is None or r.proc.returncode is not None:  # restarting: nothing runs
                    r.state = "stopped"
                    ps.replicas.remove(r)
                else:
                    r.state = "draining"
                    r.drain_started_at = time.monotonic()
                    with contextlib.suppress(ProcessLookupError):
                        r.proc.send_signal(signal.SIGTERM)
                log.info("replica draining", extra={"replica": r.id, "pool": ps.spec.name})
                return

    async def start(self) -> None:
        """Start the zygote (if configured), each pool's minimum replicas (as many as fit the
        slots) and the supervisor."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        if self.config.zygote and sys.platform == "linux":
            self._zygote = Zygote()
            await self._zygote.start(_set_pdeathsig)
        for ps in self.pools.values():  # prefetch: engines ready before the first request needs them
            if ps.spec.prefetch:
                await self._prepare(ps)
        # The pools' minimums, placed as the autoscaler would (cheapest first when the slots
        # cannot hold them all), so its first decision does not undo them.
        mins = place(sum(ps.spec.replicas.min for ps in self.pools.values()), tuple(
            PoolSnapshot(n, ps.spec.replicas.min, ps.spec.replicas.max, ps.spec.cost_usd_per_h,
                         schedulable=ps.state == "running") for n, ps in self.pools.items()
        ), self.config.replica_slots)
        await self.apply(mins, [])
        self._started = True
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name="runtime-supervisor")

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every replica: SIGTERM (they drain), then SIGKILL after ``timeout_s``."""
        self._stopping = True
        await cancel_and_wait(self._task)
        procs = []
        for ps in self.pools.values():
            for r in ps.replicas:
                r.intentional_stop = True
                r.state = "stopped"
                if r.proc and r.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        r.proc.send_signal(signal.SIGTERM)
                    procs.append(r.proc)
        if procs:
            _done, _pending = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs], timeout=timeout_s)
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
        if self._zygote is not None:
            await self._zygote.stop()
        if self._session:
            await self._session.close()
        self.discard_run_dir()  # a temporary directory of ours: replica logs go with it
        self._notify()

    def discard_run_dir(self) -> None:
        """Remove the run directory this runtime made (a temporary one): at ``stop``, or when the
        runtime is given up before ``start`` (e.g. the gateway's port is taken); a directory from
        ``config.run_dir`` stays. Before, such a failed start left ``/tmp/tideserve-*`` holding
        only ``owner.pid``, until the next start's stale sweep (found by a new user's try)."""
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # --- internals --------------------------------------------------------------------------
    def _notify(self) -> None:
        for cb in self._listeners:
            cb()

    def _new_replica(self, ps: PoolState) -> Replica:
        r = Replica(id=f"{ps.spec.name}-{ps.next_index}", pool=ps.spec.name)
        ps.next_index += 1
        ps.replicas.append(r)
        return r

    async def _spawn(self, ps: PoolState, r: Replica) -> None:
        r.port_file = self.run_dir / f"{r.id}.port"
        r.port_file.unlink(missing_ok=True)
        r.startup_file = self.run_dir / f"{r.id}.startup.json"
        r.startup_file.unlink(missing_ok=True)
        r.startup = None
        r.port, r.state, r.ready_at, r.health_failures, r.suspect = None, "starting", None, 0, False
        argv = [
            "--endpoint", str(self.endpoint_file), "--pool", ps.spec.name,
            "--replica-id", r.id, "--port", "0", "--port-file", str(r.port_file), "--log-format", self.log_format,
            "--startup-file", str(r.startup_file),
            "--drain-timeout-s", str(self.endpoint.spec.gateway.request_timeout_s),
        ]
        if self.config_file:
            argv += ["--config", str(self.config_file)]
        if ps.engine_dir is not None:
            argv += ["--model-dir", str(ps.engine_dir)]
        env = dict(os.environ)
        if self.worker_token:
            env["TIDESERVE_WORKER_TOKEN"] = self.worker_token
        r.spawned_at = time.time()
        r.started_at = time.monotonic()  # before any await: the ready timeout counts from here
        r.proc = None
        if self._zygote is not None and not self._zygote.alive and self.config.zygote and not self._stopping:
            await self._zygote.stop()
            self._zygote = Zygote()  # the last one died: start another for the replicas to come
            await self._zygote.start(_set_pdeathsig)
        if self._zygote is not None and await self._zygote.wait_ready(120):
            try:
                r.proc = await self._zygote.spawn(argv, env)
            except (TimeoutError, OSError) as exc:
                log.warning("zygote could not fork %s (%s); starting a fresh process", r.id, exc)
        if r.proc is None:
            r.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tideserve.worker", *argv, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
                preexec_fn=_set_pdeathsig if sys.platform == "linux" else None,
            )
        r.started_at = time.monotonic()
        r.intentional_stop = False
        asyncio.get_running_loop().create_task(self._pump_logs(r, r.proc))
        log.info("replica starting", extra={"replica": r.id, "pool": ps.spec.name, "pid": r.proc.pid})

    async def _pump_logs(self, r: Replica, proc: asyncio.subprocess.Process | ForkedProcess) -> None:
        """Copy a worker's output to its log file and to our stderr; keep the last lines."""
        assert proc.stdout is not None
        with open(self.run_dir / f"{r.id}.log", "ab") as f:
            async for line in proc.stdout:
                f.write(line)
                f.flush()
                text = line.decode(errors="replace").rstrip()
                r.log_tail.append(text)
                sys.stderr.write(text + "\n")
                if r.state == "starting" and ('"msg": "ready"' in text or " ready " in text):
                    self._wake.set()  # check readiness now, not at the next tick

    def _backoff(self, n_recent: int) -> float:
        rp = self.config.restart
        return min(rp.backoff_max_s, rp.backoff_initial_s * (2 ** max(0, n_recent - 1)))

    def _last_reason_line(self, r: Replica) -> str:
        return reason_line(r.log_tail)

    def _on_exit(self, ps: PoolState, r: Replica, code: int) -> None:
        ps.replica_seconds_done += time.monotonic() - r.started_at
        r.last_exit = code
        r.port = None
        if r.intentional_stop or r.state == "draining":
            r.state = "stopped"
            ps.replicas.remove(r)
            self._notify()
            return
        now = time.monotonic()
        if code == EX_CONFIG:
            ps.state, ps.reason = "unschedulable", self._last_reason_line(r)
            r.state = "stopped"
            log.error("pool %s is unschedulable: %s", ps.spec.name, ps.reason, extra={"pool": ps.spec.name})
            self._notify()
            return
        rp = self.config.restart
        r.restarts = [t for t in r.restarts if now - t <= rp.window_s]
        if len(r.restarts) >= rp.max_restarts:
            ps.state = "failed"
            ps.reason = (
                f"replica {r.id} exited with code {code} and was restarted {len(r.restarts)} times within "
                f"{rp.window_s:g} s; giving up. Last log line: {self._last_reason_line(r)}"
            )
            r.state = "stopped"
            log.error("pool %s failed: %s", ps.spec.name, ps.reason, extra={"pool": ps.spec.name})
            self._notify()
            return
        r.restarts.append(now)
        delay = self._backoff(len(r.restarts))
        r.state, r.next_start_at = "restarting", now + delay
        log.warning(
            "replica %s exited with code %s; restarting in %.1f s", r.id, code, delay,
            extra={"replica": r.id, "pool": ps.spec.name, "exit_code": code},
        )
        self._notify()

    async def _probe(self, r: Replica) -> bool:
        assert self._session is not None
        try:
            headers = {TOKEN_HEADER: self.worker_token} if self.worker_token else None
            async with self._session.get(r.url + "/v2/health/ready", headers=headers) as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def _check(self, ps: PoolState, r: Replica, now: float) -> None:
        if r.state == "starting":
            if r.port is None and r.port_file and r.port_file.exists():
                r.port = int(r.port_file.read_text())
            if r.port is not None and await self._probe(r):
                r.state, r.ready_at, r.last_health_at = "ready", time.monotonic(), time.monotonic()
                r.startup = self._startup_phases(r)
                for cb in self._ready_listeners:
                    cb(ps.spec.name, r.startup or {})
                log.info("replica ready", extra={"replica": r.id, "pool": ps.spec.name,
                                                  "startup_s": round(r.ready_at - r.started_at, 3)})
                self._notify()
            elif now - r.started_at > self.config.ready_timeout_s:
                log.error("replica %s not ready after %.0f s; killing it", r.id, self.config.ready_timeout_s)
                self._kill(r)
        elif r.state == "ready" and now - r.last_health_at >= self.config.health_interval_s:
            r.last_health_at = now
            if await self._probe(r):
                r.health_failures = 0
                if r.suspect:
                    r.suspect = False
                    self._notify()
            else:
                r.health_failures += 1
                if r.health_failures >= HEALTH_FAILURES_BEFORE_RESTART:
                    log.error("replica %s failed %d health checks; killing it", r.id, r.health_failures)
                    self._kill(r)
                else:
                    r.last_health_at = now - self.config.health_interval_s + 0.2  # re-check soon

    def _startup_phases(self, r: Replica) -> dict | None:
        """Cold-start phases of a replica that just became ready, in seconds: process start
        (spawn -> interpreter runs our code), imports (up to the start of the model load),
        model load and, overlapping it, HTTP imports and bind; readiness detection (worker
        ready -> runtime saw it)."""
        try:
            ph = json.loads(r.startup_file.read_text()) if r.startup_file else None
        except (OSError, ValueError):
            return None
        if not ph or r.spawned_at is None:
            return None
        seen = time.time()
        return {
            "process_start_s": round(ph["interpreter"] - r.spawned_at, 3),
            "imports_s": round(ph["imported"] - ph["interpreter"], 3),
            # The HTTP stack is imported and bound while the model loads: these two overlap.
            "model_load_s": round(ph["model_loaded"] - ph["imported"], 3),
            "http_ready_s": round(ph["listening"] - ph["imported"], 3),
            "readiness_detection_s": round(seen - ph["model_loaded"], 3),
            "total_s": round(seen - r.spawned_at, 3),
        }

    def _kill(self, r: Replica) -> None:
        if r.proc and r.proc.returncode is None:
            r.proc.kill()

    async def _supervise(self) -> None:
        while True:
            now = time.monotonic()
            checks = []
            for ps in self.pools.values():
                for r in list(ps.replicas):
                    if r.proc is not None and r.proc.returncode is not None and r.state not in ("restarting", "stopped"):
                        self._on_exit(ps, r, r.proc.returncode)
                        continue
                    if r.state == "restarting" and now >= r.next_start_at and ps.state == "running":
                        await self._spawn(ps, r)
                        self._notify()
                    elif r.state in ("starting", "ready"):
                        checks.append(self._check(ps, r, now))
            if checks:
                await asyncio.gather(*checks)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.tick_s)
