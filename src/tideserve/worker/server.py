"""Worker process entry point: ``python -m tideserve.worker --endpoint FILE --pool NAME``.

Start-up order: bind the HTTP port (health answers "not ready"), write the port file,
check the engine target against this device, resolve the model source, load the model,
warm it up with one second of silence, then report ready.

Exit codes: 0 after a clean drain; 78 (EX_CONFIG) when the replica can never start here
(engine target mismatch, missing model source, invalid spec) so the runtime does not restart
it; 1 for anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
from aiohttp import web

from tideserve.engines import check_target, probe_device
from tideserve.errors import EngineMismatchError, SourceError, SpecError
from tideserve.logs import setup_logging
from tideserve.metrics.triton import TritonMetrics
from tideserve.sources import resolve_source
from tideserve.spec import load_endpoint, load_local_config
from tideserve.worker.api import WorkerService, build_app
from tideserve.worker.backends import backend_class
from tideserve.worker.backends.base import WindowTask
from tideserve.worker.batcher import DynamicBatcher

EX_CONFIG = 78
log = logging.getLogger("tideserve.worker")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tideserve.worker", description="Serve one replica of an endpoint's pool.")
    p.add_argument("--endpoint", required=True, help="InferenceEndpoint YAML file")
    p.add_argument("--pool", required=True, help="pool name in the endpoint")
    p.add_argument("--replica-id", default="replica-0")
    p.add_argument("--config", default=None, help="local config YAML (allowed file roots, threads)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (see --port-file)")
    p.add_argument("--port-file", default=None, help="write the bound port here once listening")
    p.add_argument("--cpu-threads", type=int, default=None, help="intra-op threads (default: local config)")
    p.add_argument("--drain-timeout-s", type=float, default=300.0)
    p.add_argument("--log-format", choices=["json", "text"], default="json")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    endpoint = load_endpoint(args.endpoint)
    cfg = load_local_config(args.config)
    spec = endpoint.spec
    pool = spec.pool(args.pool)
    metrics = TritonMetrics(spec.model.name)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    # The model is loaded below; until then the batcher has a placeholder executor.
    holder: dict = {}
    batcher: DynamicBatcher = DynamicBatcher(
        lambda tasks: holder["backend"].transcribe_batch(tasks),
        spec.batching.max_batch_size, spec.batching.max_queue_delay_ms / 1000.0, metrics,
    )
    service = WorkerService(spec.model.name, None, batcher, metrics)  # type: ignore[arg-type]
    app = build_app(service, spec.gateway.max_body_bytes, os.environ.get("TIDESERVE_WORKER_TOKEN") or None)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    if args.port_file:
        tmp = Path(args.port_file + ".tmp")
        tmp.write_text(str(port))
        tmp.replace(args.port_file)
    log.info("listening", extra={"port": port, "pool": pool.name, "replica": args.replica_id})

    t0 = time.monotonic()
    target = pool.parsed_target
    check_target(target, probe_device())
    model_dir = resolve_source(spec.model.source, cfg.allowed_file_roots)
    threads = args.cpu_threads if args.cpu_threads is not None else cfg.cpu_threads_per_replica
    backend = await loop.run_in_executor(
        None, lambda: backend_class(spec.model.backend)(model_dir, target, spec.model.decoding, cpu_threads=threads)
    )
    holder["backend"] = backend
    service.backend = backend
    t1 = time.monotonic()
    await loop.run_in_executor(None, backend.transcribe_batch, [WindowTask(np.zeros(16_000, np.float32))])
    batcher.start()
    service.state.ready = True
    log.info("ready", extra={"load_s": round(t1 - t0, 3), "warmup_s": round(time.monotonic() - t1, 3)})

    parent = os.getppid()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            if os.getppid() != parent:
                log.warning("parent process went away; shutting down")
                break

    # Drain: stop taking new work, finish what is queued or running, then exit.
    service.state.draining = True
    deadline = time.monotonic() + args.drain_timeout_s
    while (service.state.in_flight or batcher.queued) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    log.info("drained; exiting", extra={"left_in_flight": service.state.in_flight})
    await batcher.close()
    await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging("worker", args.log_format)
    try:
        return asyncio.run(serve(args))
    except (EngineMismatchError, SourceError, SpecError, KeyError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) else str(exc)
        log.error("cannot start replica: %s", msg, extra={"reason": type(exc).__name__})
        print(f"tideserve-worker: cannot start: {msg}", file=sys.stderr, flush=True)
        return EX_CONFIG
    except KeyboardInterrupt:
        return 0
