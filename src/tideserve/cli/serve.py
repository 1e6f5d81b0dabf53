"""``tideserve up``: the gateway and the local runtime in one process (the embedded mode)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import signal
import ssl
import sys
from pathlib import Path

from aiohttp import web

from tideserve.autoscaler.loop import Autoscaler
from tideserve.cli.engines import prepare_engine
from tideserve.files import read_or_create_secret, write_atomic
from tideserve.gateway.app import build_gateway_app
from tideserve.gateway.grpc_server import InferenceGrpcServer
from tideserve.httpguard import GuardedAppRunner
from tideserve.runtime.local import LocalRuntime
from tideserve.spec import InferenceEndpoint, LocalConfig

log = logging.getLogger("tideserve.up")


def _ssl_context(cfg: LocalConfig) -> ssl.SSLContext | None:
    if cfg.tls_cert_file is None or cfg.tls_key_file is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cfg.tls_cert_file), str(cfg.tls_key_file))
    return ctx


async def run_endpoint(
    endpoint_file: Path,
    endpoint: InferenceEndpoint,
    cfg: LocalConfig,
    config_file: Path | None,
    log_format: str,
    port_file: Path | None = None,
    build_missing: bool = True,
) -> int:
    gw = endpoint.spec.gateway
    try:
        ctx = _ssl_context(cfg)
    except (OSError, ssl.SSLError) as exc:
        print(f"tideserve: cannot use the TLS certificate {cfg.tls_cert_file} and key {cfg.tls_key_file}: {exc}; "
              "give PEM files (tls_cert_file, tls_key_file in the local config)", file=sys.stderr)
        return 2
    try:
        token = read_or_create_secret(cfg.worker_token_path, lambda: secrets.token_urlsafe(24))
    except (OSError, ValueError) as exc:
        # Serve anyway (an unusable cache_dir is reported per pool): workers get a token for this
        # run only, which Prometheus cannot read; the warning says how to fix it.
        token = secrets.token_urlsafe(24)
        log.warning("cannot use the worker token file %s (%s); workers get a token for this run only, so "
                    "Prometheus cannot scrape them: set worker_token_file in the local config to a writable path",
                    cfg.worker_token_path, exc)
    runtime = LocalRuntime(endpoint_file, endpoint, cfg, config_file, worker_token=token, log_format=log_format,
                           prepare=lambda pool: prepare_engine(endpoint, pool, cfg, build_missing))
    autoscaler: Autoscaler | None = None
    app = build_gateway_app(endpoint, runtime, cfg.all_api_keys(), token, extra_status=lambda: autoscaler.status() if autoscaler else {})
    dispatcher = app["dispatcher"]
    runtime.add_listener(dispatcher.notify)
    runtime.on_replica_ready(lambda pool, phases: app["metrics"].observe_cold_start(endpoint.metadata.name, pool, phases))
    autoscaler = Autoscaler(endpoint.spec, dispatcher, runtime)
    dispatcher.on_hold = autoscaler.wake

    runner = GuardedAppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=gw.request_timeout_s,
                              header_timeout_s=gw.header_timeout_s, idle_timeout_s=gw.idle_timeout_s,
                              max_connections_per_client=gw.max_connections_per_client)
    await runner.setup()
    site = web.TCPSite(runner, gw.host, gw.port, ssl_context=ctx)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        runtime.discard_run_dir()
        print(f"tideserve: cannot listen on {gw.host}:{gw.port}: {exc.strerror}; "
              "stop what uses that port, or pass --port (or set spec.gateway.port)", file=sys.stderr)
        return 1
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    scheme = "https" if ctx else "http"
    url = f"{scheme}://{gw.host}:{port}"
    grpc_server: InferenceGrpcServer | None = None
    if gw.grpc_port is not None:
        grpc_server = InferenceGrpcServer(app["core"], gw.max_body_bytes)
        try:
            tls = None
            if cfg.tls_key_file is not None and cfg.tls_cert_file is not None:  # as the HTTP side (_ssl_context)
                tls = (Path(cfg.tls_key_file).read_bytes(), Path(cfg.tls_cert_file).read_bytes())
            app["grpc_port"] = await grpc_server.start(gw.host, gw.grpc_port, tls)
        except (OSError, RuntimeError) as exc:
            await runner.cleanup()
            runtime.discard_run_dir()
            print(f"tideserve: cannot listen for gRPC on {gw.host}:{gw.grpc_port}: {exc}; "
                  "stop what uses that port or set spec.gateway.grpc_port", file=sys.stderr)
            return 1
    if port_file:
        write_atomic(port_file, str(port))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    # Start-up (engine preparation may fetch a model) stays interruptible by Ctrl-C / SIGTERM.
    starting = asyncio.ensure_future(runtime.start())
    stopped_early = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopped_early}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        log.info("stopping during start-up")
        if grpc_server is not None:
            await grpc_server.stop(0)
        await runner.cleanup()
        await runtime.stop()
        return 0
    stopped_early.cancel()
    starting.result()
    autoscaler.start()
    auth = ' -H "Authorization: Bearer $TIDESERVE_API_KEY"' if cfg.all_api_keys() else ""
    cli_opts = f" --url {url}"
    if ctx:
        cli_opts += f" --cacert {cfg.tls_cert_file}"
    key_note = " (with $TIDESERVE_API_KEY set)" if cfg.all_api_keys() else ""
    mins = sum(p.replicas.min for p in endpoint.spec.pools)
    replicas_note = ("replicas start in the background" if mins else
                     "no replica runs until the first request, which is held while one starts")
    unusable = [p for p in runtime.status()["pools"] if p["state"] == "unschedulable"]
    if len(unusable) == len(endpoint.spec.pools):
        replicas_note = ("but NO pool can run on this machine, so every request is refused (503):\n    "
                         + "\n    ".join(f"pool {p['name']}: {p['reason']}" for p in unusable))
    cacert = f" --cacert {cfg.tls_cert_file}" if ctx else ""
    cli = cli_command()
    print(
        f"tideserve: endpoint '{endpoint.metadata.name}' serves model '{endpoint.spec.model.name}' at {url}\n"
        f"  {replicas_note}; `{cli} status{cli_opts}`{key_note} shows them.\n"
        f"  try:  (printf '{{\"audio_data\": \"'; base64 -w0 clip.wav; printf '\"}}') | "
        f"curl{cacert} -X POST {url}/invocations{auth} -H 'Content-Type: application/json' --data-binary @-\n"
        f"  or:   {cli} invoke {endpoint_file} clip.wav{cli_opts}{key_note}\n"
        + (f"  gRPC (KServe v2 / Triton): {gw.host}:{app['grpc_port']}\n" if app.get("grpc_port") else "") +
        "  Ctrl-C stops the endpoint and every replica.",
        file=sys.stderr, flush=True,
    )
    log.info("gateway listening", extra={"url": url, "endpoint": endpoint.metadata.name, "run_dir": str(runtime.run_dir),
                                         "grpc_port": app.get("grpc_port")})
    await stop.wait()
    log.info("stopping: draining requests and replicas")
    await autoscaler.stop()
    if grpc_server is not None:
        await grpc_server.stop(gw.request_timeout_s)
    await runner.cleanup()
    await runtime.stop()
    log.info("stopped")
    return 0


def cli_command(argv0: str | None = None, executable: str | None = None) -> str:
    """How the user's shell runs this CLI, for the start-up banner's example commands:
    ``tideserve`` when that name on PATH is the program that is running; else its absolute path
    (``make run`` starts ``.venv/bin/tideserve``, which a shell without the virtualenv activated
    finds only by its path, from whatever folder it is in); started another way (``python -m
    tideserve``, a link of another name), ``<this Python's absolute path> -m tideserve``.
    ``argv0``/``executable``: ``sys.argv[0]`` and ``sys.executable`` (tests pass their own)."""
    started = Path(argv0 if argv0 is not None else sys.argv[0])
    if started.name != "tideserve":
        return f"{Path(executable or sys.executable).absolute()} -m tideserve"
    on_path = shutil.which("tideserve")
    if on_path and Path(on_path).resolve() == started.resolve():
        return "tideserve"
    return str(started.absolute())
