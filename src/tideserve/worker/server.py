"""Worker process entry point: ``python -m tideserve.worker --endpoint FILE --pool NAME``.

Start-up order: check the engine target against this device, resolve the model source, fork
the engine process (which loads the model); meanwhile start the prep processes, bind the port
(health answers "not ready") and write the port file; once the engine has loaded the model,
report ready (``--startup-file`` receives the time of each phase). This process then only
serves HTTP: prep processes parse and decode, the engine process runs the model.

Exit codes: 0 after a clean drain; 78 (EX_CONFIG) when the replica can never start here
(engine target mismatch, missing model source, invalid spec) so the runtime does not restart
it; 1 for anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from tideserve.engines import check_target, probe_device
from tideserve.errors import EngineMismatchError, MissingExtraError, SourceError, SpecError
from tideserve.logs import setup_logging
from tideserve.sources import resolve_source
from tideserve.spec import load_endpoint, load_local_config
from tideserve.files import write_atomic
from tideserve.worker.engine_client import EngineLoadError
from tideserve.worker.language_id import LanguageIdConfig

# The HTTP stack (aiohttp, the API module, prometheus-client) is imported inside serve(), after
# the model has started loading on another thread, so that the two overlap (cold start).

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
    p.add_argument("--startup-file", default=None, help="write start-up phase times (JSON) here once ready")
    p.add_argument("--model-dir", default=None,
                   help="the prepared engine directory (the runtime fetched and checked it); default: resolve the source")
    p.add_argument("--cpu-threads", type=int, default=None, help="intra-op threads (default: local config)")
    p.add_argument("--prep-processes", type=int, default=0,
                   help="processes that parse bodies and decode audio (default: local config, else a quarter of the cores, 1-8)")
    p.add_argument("--drain-timeout-s", type=float, default=300.0)
    p.add_argument("--log-format", choices=["json", "text"], default="json")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace, phases: dict[str, float]) -> int:
    endpoint = load_endpoint(args.endpoint)
    cfg = load_local_config(args.config)
    spec = endpoint.spec
    pool = spec.pool(args.pool)
    target = pool.parsed_target
    check_target(target, probe_device())
    model_dir = Path(args.model_dir) if args.model_dir else resolve_source(
        spec.model.source, cfg.allowed_file_roots, cfg.cache_dir)
    lid = spec.model.language_id
    language_id = None if lid is None else LanguageIdConfig(
        str(resolve_source(lid.source, cfg.allowed_file_roots, cfg.cache_dir)), seconds=lid.seconds,
        min_probability=lid.min_probability, reject=lid.on_other_language == "reject")
    threads = args.cpu_threads if args.cpu_threads is not None else cfg.cpu_threads_per_replica
    phases["imported"] = time.time()

    from tideserve.metrics.triton import TritonMetrics
    from tideserve.worker.engine import EngineConfig, default_instances
    from tideserve.worker.engine_client import EngineClient

    metrics = TritonMetrics(spec.model.name)
    # The engine process is forked first, while this process runs no thread (see engine_client);
    # it loads the model while this process starts its prep processes and binds the port.
    engine = EngineClient(EngineConfig(
        backend=spec.model.backend, model_dir=str(model_dir), target=target, decoding=spec.model.decoding,
        max_batch_size=spec.batching.max_batch_size, max_queue_delay_s=spec.batching.max_queue_delay_ms / 1000.0,
        cpu_threads=threads, instances=spec.batching.instances or default_instances(), language_id=language_id,
        model_name=spec.model.name, background_nice=spec.batching.background_nice,
        kv_cache_dtype=spec.model.kv_cache_dtype, cross_attention=spec.model.cross_attention,
        encode_ahead=spec.batching.encode_ahead),
        on_stats=metrics.on_engine_stats)
    loop = asyncio.get_running_loop()

    from aiohttp import web

    from tideserve.worker.api import WorkerService, build_app
    from tideserve.worker.prep import PrepPool, default_processes

    prep = PrepPool(args.prep_processes or cfg.prep_processes or default_processes(gpu=target.device != "cpu"),
                    handoff=engine.handoff, stall_s=cfg.prep_stall_s)
    prep.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    token = os.environ.get("TIDESERVE_WORKER_TOKEN") or None
    service = WorkerService(spec.model.name, prep, engine, metrics, spec.gateway.max_audio_s, spec.gateway.max_prompt_chars,
                            max_audio_s_in_flight=spec.gateway.max_audio_s_in_flight, aliases=tuple(spec.model.aliases),
                            spread_min_audio_s=spec.spread_min_audio_s,
                            spread_max_parts=spec.gateway.spread_max_parts, token=token,
                            spread_part_grace_s=spec.gateway.spread_part_grace_s,
                            without_timestamps=spec.model.decoding.without_timestamps)
    app = build_app(service, spec.gateway.max_body_bytes, token, platform=spec.model.backend)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    if args.port_file:
        write_atomic(args.port_file, str(port))
    phases["listening"] = time.time()
    log.info("listening", extra={"port": port, "pool": pool.name, "replica": args.replica_id,
                                 "prep_processes": prep.processes, "engine_pid": engine.process.pid})

    try:
        info = await engine.start()
    except BaseException:
        await runner.cleanup()
        prep.close()
        engine.stop(1.0)
        raise
    service.languages = frozenset(info["languages"])
    phases["model_loaded"] = time.time()
    metrics.model_loaded(spec.model.source.partition("://")[0], phases["model_loaded"] - phases["imported"])
    # No warm-up inference: measured here it cost 0.5-0.6 s of start-up to save ~0.1 s on the
    # first request (bench/cold_start.py), and loading already validates the model.
    service.state.ready = True
    if args.startup_file:
        write_atomic(args.startup_file, json.dumps(phases))
    log.info("ready", extra={"phases_s": {k: round(v - phases["interpreter"], 3) for k, v in phases.items()},
                             "continuous_batching": info.get("continuous", False)})

    parent = os.getppid()
    code = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            if os.getppid() != parent:
                log.warning("parent process went away; shutting down")
                break
            if engine.dead:
                log.error("the engine process exited; this replica stops so that it is restarted")
                code = 1
                break
            stalled = engine.stalled_s()
            if stalled > cfg.engine_stall_s:
                log.error("the engine process made no progress for %.0f s (local config engine_stall_s=%g: stopped "
                          "or hung); it is ended and this replica stops so that it is restarted",
                          stalled, cfg.engine_stall_s)
                engine.kill()
                code = 1
                break

    # Drain: stop taking new work, finish what is queued or running, then exit.
    service.state.draining = True
    deadline = time.monotonic() + args.drain_timeout_s
    while service.state.in_flight and not engine.dead and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    log.info("drained; exiting", extra={"left_in_flight": service.state.in_flight})
    await runner.cleanup()
    await service.close()
    prep.close()
    engine.stop()
    return code


def main(argv: list[str] | None = None, started_at: float | None = None) -> int:
    """Run a worker. ``started_at``: wall time the interpreter reached tideserve code (set by
    ``python -m tideserve.worker`` before its imports), for the cold-start phase split."""
    phases = {"interpreter": started_at or time.time(), "imported": time.time()}
    args = parse_args(argv)
    setup_logging("worker", args.log_format)
    try:
        return asyncio.run(serve(args, phases))
    except SourceError as exc:
        if exc.retryable:  # e.g. the network: a restart (with backoff) may succeed
            log.error("cannot fetch the model: %s", exc, extra={"reason": type(exc).__name__})
            return 1
        log.error("cannot start replica: %s", exc, extra={"reason": type(exc).__name__})
        print(f"tideserve-worker: cannot start: {exc}", file=sys.stderr, flush=True)
        return EX_CONFIG
    except EngineLoadError as exc:
        log.error("cannot load the model: %s", exc, extra={"reason": exc.kind})
        return 1
    except (EngineMismatchError, MissingExtraError, SpecError, KeyError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) else str(exc)
        log.error("cannot start replica: %s", msg, extra={"reason": type(exc).__name__})
        print(f"tideserve-worker: cannot start: {msg}", file=sys.stderr, flush=True)
        return EX_CONFIG
    except KeyboardInterrupt:
        return 0
