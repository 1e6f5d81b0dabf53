"""The gateway's HTTP application: the single entry in front of every replica.

Inference requests (``/invocations``, ``/v2/models/{name}/infer``,
``/v1/audio/transcriptions``) are forwarded unchanged to a replica chosen by the routing
policy, within ``request_timeout_s``; health, metadata, metrics and the admin API are
answered here. If the client disconnects, the handler is cancelled and so is the
forwarded request, which makes the worker drop the work before computing it.

A replica that fails at the connection level (refused, reset: it crashed) is reported to the
runtime and the request is re-sent to another replica, at most ``MAX_ATTEMPTS`` times in
all: transcription is idempotent, so a retry cannot do harm. A replica that answers 503 is
tried no more for this request; one that says it is not ready (``NOT_READY_HEADER``: loading,
draining, its engine gone) is also reported, and that try is not counted (up to
``MAX_NOT_READY_TRIES``): the request waits for a ready replica, such as its replacement.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from tideserve import __version__
from tideserve.errors import (
    CapacityError,
    RequestTimeoutError,
    TideserveError,
    UnauthorizedError,
    UnknownModelError,
    UpstreamError,
)
from tideserve.gateway.dispatch import AUDIO_HEADER, Dispatcher, estimate_audio_s
from tideserve.replicas import ReplicaSource
from tideserve.gateway.metrics import GatewayMetrics
from tideserve.httpguard import read_body
from tideserve.httpcommon import (
    OPENAPI_PATH_VALUES,
    OPENAPI_TITLE,
    REQUEST_ID,
    ApiHandlers,
    add_api_routes,
    error_body_message,
    error_response,
    log_error_text,
    request_id_and_errors,
)
from tideserve.protocol import kserve, openai, sagemaker
from tideserve.protocol.errors import api_family
from tideserve.protocol.internal import COMPUTE_HEADER, NOT_READY_HEADER, PARTS_HEADER, SPREAD_HEADER, TOKEN_HEADER
from tideserve.protocol.types import LANGUAGE_MISMATCH_HEADER
from tideserve.spec import InferenceEndpoint

log = logging.getLogger("tideserve.gateway")
MAX_ATTEMPTS = 3
MAX_NOT_READY_TRIES = 8
# AUDIO_HEADER: the client's duration, for the work estimate (and the offer of idle replicas).
_FORWARD_REQUEST_HEADERS = ("Content-Type", kserve.HEADER_LENGTH, "Accept", AUDIO_HEADER)
_FORWARD_RESPONSE_HEADERS = ("Content-Type", kserve.HEADER_LENGTH, "Retry-After", LANGUAGE_MISMATCH_HEADER, PARTS_HEADER)
OPEN_PATHS = frozenset({"/ping", "/v2/health/live", "/v2/health/ready", "/openapi.json"})


def _is_inference_path(path: str) -> bool:
    return path in ("/invocations", "/v1/audio/transcriptions", "/v1/audio/translations") \
        or (path.startswith("/v2/models/") and path.endswith("/infer")) \
        or (path.startswith("/endpoints/") and path.endswith("/invocations"))


def _api_key(request: web.Request) -> str | None:
    """The API key a request carries: ``Authorization: Bearer KEY``, or on the SageMaker runtime
    route (whose clients sign ``Authorization`` with SigV4) the ``tideserve-api-key``
    CustomAttributes item."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key:
        return key
    if request.path.startswith("/endpoints/"):
        return sagemaker.api_key_from_custom_attributes(request.headers.get(sagemaker.CUSTOM_ATTRIBUTES))
    return None


class Runtime(ReplicaSource, Protocol):
    """What the gateway needs of a runtime beyond routing: status and failure reports."""

    def status(self) -> dict: ...
    def report_unreachable(self, replica_id: str) -> None: ...
    def scrape_targets(self) -> list[dict]: ...


#: What one request's handling records (hold time, pool, replica, compute time): the aiohttp
#: request itself, or a dict for gRPC.
Ctx = MutableMapping[Any, Any]


@dataclass(frozen=True)
class GatewayCore:
    """What another protocol front (the gRPC inference service) needs of the gateway, so that
    it holds, limits, routes, retries, counts and authorizes exactly as HTTP does.

    ``call(ctx, method, path, body, headers)``: see ``build_gateway_app``'s ``call``;
    ``account(ctx, api, status, started)``: count an answered request; ``arrived()``: an
    arrival for the autoscaler; ``key_ok(key)``: whether an API key opens the gateway (True
    when none are configured); ``accepting()``: whether requests are accepted."""

    endpoint: InferenceEndpoint
    stats: kserve.InferenceStats
    call: Callable[..., Awaitable[Any]]
    account: Callable[[Ctx, str, int, float], None]
    arrived: Callable[[], None]
    key_ok: Callable[[str | None], bool]
    accepting: Callable[[], bool]


def build_gateway_app(
    endpoint: InferenceEndpoint,
    runtime: Runtime,
    api_keys: list[str] | None = None,
    worker_token: str | None = None,
    extra_status: Callable[[], dict] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> web.Application:
    """The gateway app. ``extra_status`` adds keys to ``/admin/status`` (the autoscaler's
    last decision). The app's ``dispatcher`` (``app["dispatcher"]``) is the load view.
    ``clock`` times the dispatcher and each pool's measured service time (tests inject one)."""
    spec = endpoint.spec
    gw = spec.gateway
    model = spec.model.name
    ep_name = endpoint.metadata.name
    keys = [k.encode() for k in (api_keys or [])]
    metrics = GatewayMetrics()
    costs = {p.name: p.cost_usd_per_h for p in spec.pools}
    metrics.register_cost(ep_name, lambda: (
        (p["name"], costs.get(p["name"], 0.0), p["replica_seconds"]) for p in runtime.status()["pools"]))
    dispatcher = Dispatcher(runtime, gw.max_pending, gw.hold_timeout_s, clock)
    stats = kserve.InferenceStats()

    def key_ok(key: str | None) -> bool:
        """The key exactly as sent (no stripping: keys hold no whitespace), compared in constant
        time against every configured key; any key (or none) when none are configured."""
        if not keys:
            return True
        sent = (key or "").encode("utf-8", "surrogateescape")
        return any(hmac.compare_digest(sent, k) for k in keys)

    @web.middleware
    async def auth(request: web.Request, handler):
        if keys and request.path not in OPEN_PATHS:
            key = _api_key(request)
            if key is None:
                raise UnauthorizedError("missing API key: send 'Authorization: Bearer <key>' (SageMaker runtime "
                                        f"clients: CustomAttributes='{sagemaker.API_KEY_ATTRIBUTE}=<key>')")
            if not key_ok(key):
                raise UnauthorizedError("invalid API key")
        return await handler(request)

    @web.middleware
    async def read_unused_body(request: web.Request, handler):
        # Routes other than inference ignore a body, but aiohttp would still read (and decode)
        # it after the answer, and a body not valid for its Content-Encoding then drops the
        # connection without an answer. Read it first, with the same limits: errors are 4xx.
        if request.body_exists and not (request.method == "POST" and _is_inference_path(request.path)):
            request["body"] = await read_body(request, gw.max_body_bytes, gw.idle_timeout_s)
        return await handler(request)

    def account(ctx: Ctx, api: str, status: int, started: float) -> None:
        """Count one answered inference request (``ctx``: what ``call`` recorded about it) in
        the metrics, the Triton statistics and the request log, whatever its protocol."""
        total_s = time.monotonic() - started
        if status == 200:
            stats.success(total_s, ctx.get("hold_ms", 0.0) / 1000, ctx.get("compute_s"), time.time())
        elif status != 404:  # a 404 named another model (or no route): not an inference of this one
            stats.failure(total_s)
        if "audio_s" in ctx and status in (200, CapacityError.http_status, RequestTimeoutError.http_status):
            # The autoscaler's SLO term: answered in time or not; refused or timed out: late.
            dispatcher.answered(total_s if status == 200 else None, spec.autoscaling.slo_p95_s, ctx["audio_s"],
                                ctx.get("ready_at_arrival"))
        metrics.requests.labels(ep_name, ctx.get("pool", "none"), api, str(status)).inc()
        metrics.latency.labels(ep_name, api).observe(total_s)
        # An error's reason goes to the log too (before, only its status: the reason reached the
        # client alone; found by a new user's try).
        error = {"error": ctx["error"]} if status >= 400 and ctx.get("error") else {}
        log.info(
            "request",
            extra={"endpoint": ep_name, "api": api, "status": status, "pool": ctx.get("pool"),
                   "replica": ctx.get("replica"), "duration_ms": round(total_s * 1000, 1), "hold_ms": ctx.get("hold_ms"),
                   **error},
        )

    @web.middleware
    async def count(request: web.Request, handler):
        started = time.monotonic()
        resp = await handler(request)
        if request.get("inference"):
            account(request, api_family(request.path), resp.status, started)
        return resp

    # Error responses from inner middlewares and handlers become Responses in
    # request_id_and_errors; `count` sits inside it so it sees only handler results, so the
    # inference handlers below turn their own errors into responses via this wrapper.
    def inference(handler):
        async def wrapped(request: web.Request) -> web.StreamResponse:
            request["inference"] = True
            try:
                return await handler(request)
            except TideserveError as err:
                request["error"] = log_error_text(err.message)
                return error_response(request, err)

        return wrapped

    app = web.Application(client_max_size=gw.max_body_bytes, middlewares=[request_id_and_errors, auth, read_unused_body, count])
    app[OPENAPI_TITLE] = f"tideserve gateway of endpoint {ep_name} (model {model})"
    names = [model, *spec.model.aliases]
    app[OPENAPI_PATH_VALUES] = {"name": names, "model": names, "endpoint": [ep_name]}  # any version is served

    async def on_startup(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=5),
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            auto_decompress=False,
        )

    async def on_cleanup(app: web.Application) -> None:
        await app["session"].close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app["dispatcher"] = dispatcher
    app["metrics"] = metrics

    async def forward(request: web.Request, upstream_path: str | None = None) -> web.StreamResponse:
        """Send ``request`` to a replica (at ``upstream_path``, default its own path)."""
        dispatcher.arrived()
        request["started"] = time.monotonic()
        try:
            # A body that trickles in (slowloris) is bounded by the same request timeout.
            async with asyncio.timeout(gw.request_timeout_s):
                body = await read_body(request, gw.max_body_bytes, gw.idle_timeout_s)
        except TimeoutError:
            raise RequestTimeoutError(
                f"the request body did not arrive within request_timeout_s={gw.request_timeout_s:g}") from None
        headers = {h: request.headers[h] for h in _FORWARD_REQUEST_HEADERS if h in request.headers}
        try:
            out = await call(request, request.method, upstream_path or request.path_qs, body, headers,
                             lambda resp, pool, sent: relay_events(request, resp, pool, sent))
        except RequestTimeoutError as err:
            stream: web.StreamResponse | None = request.get("stream")
            if stream is None:
                raise
            await stream.write(openai.error_event(err.code, err.message))  # the status line is already sent
            await stream.write_eof()
            return stream
        if isinstance(out, web.StreamResponse):
            return out
        status, out_headers, data = out
        if status >= 400:  # a replica's error answer, relayed: its reason for the request log
            request["error"] = log_error_text(error_body_message(data))
        return web.Response(status=status, body=data, headers=out_headers)

    async def call(ctx: Ctx, method: str, path: str, body: bytes, headers: dict[str, str],
                   on_stream: Callable[[aiohttp.ClientResponse, str, float], Awaitable[web.StreamResponse]] | None = None,
                   ) -> tuple[int, dict[str, str], bytes] | web.StreamResponse:
        """Send one inference request to a replica, holding it while none can take it, retrying
        another on a dropped connection or a 503: ``(status, response headers, body)`` of the
        replica's answer, or what ``on_stream`` returns for a server-sent event stream. ``ctx``
        (the aiohttp request, or a dict for gRPC) must hold ``request_id``; the hold time,
        pool, replica and compute time are recorded there. Raises UpstreamError (502) when
        every attempt lost its replica, RequestTimeoutError past ``request_timeout_s``,
        CapacityError when nothing can take it (see Dispatcher.acquire)."""
        ctx.setdefault("started", time.monotonic())
        audio_est = estimate_audio_s(body, headers)  # work estimate (dispatch.py says how)
        dispatcher.arrived_work(audio_est)
        ctx["audio_s"], ctx["ready_at_arrival"] = audio_est, dispatcher.ready_replicas()
        headers = {**headers, REQUEST_ID: ctx["request_id"]}
        if worker_token:
            headers[TOKEN_HEADER] = worker_token
        session: aiohttp.ClientSession = app["session"]
        failed: set[str] = set()
        try:
            async with asyncio.timeout(gw.request_timeout_s):
                attempt, not_ready = 0, 0
                while attempt < MAX_ATTEMPTS:
                    attempt += 1
                    held = time.monotonic()
                    metrics.pending.labels(ep_name).set(dispatcher.pending + 1)
                    try:
                        replica = await dispatcher.acquire(frozenset(failed), audio_s=audio_est)
                    finally:
                        metrics.pending.labels(ep_name).set(dispatcher.pending)
                    metrics.hold.labels(ep_name).observe(time.monotonic() - held)
                    ctx["hold_ms"] = round((time.monotonic() - held) * 1000, 1)
                    ctx["pool"], ctx["replica"] = replica.pool, replica.id
                    metrics.routed.labels(ep_name, replica.pool).inc()
                    # Idle replicas the worker may send parts of a long file to (it decides on the
                    # decoded duration), reserved so that the load view counts them. Offered on the
                    # estimate (estimate_audio_s), so that a reservation is rarely left unused: a
                    # compressed file is spread from 2-4x the threshold, or when the client sends
                    # its duration (AUDIO_HEADER).
                    helpers = dispatcher.reserve_idle(frozenset(failed | {replica.id}), gw.spread_max_parts - 1) \
                        if spec.spread_min_audio_s and audio_est >= spec.spread_min_audio_s else []
                    metrics.in_flight.labels(ep_name).set(dispatcher.in_flight())
                    sent_headers = {**headers, SPREAD_HEADER: ",".join(h.url for h in helpers)} if helpers else headers
                    try:
                        sent = clock()
                        async with session.request(method, replica.url + path, data=body, headers=sent_headers) as resp:
                            if resp.status == 200 and resp.content_type == "text/event-stream" and on_stream:
                                return await on_stream(resp, replica.pool, sent)
                            data = await resp.read()
                            if resp.status == 200:
                                dispatcher.record_service(replica.pool, clock() - sent)
                                compute_ms = resp.headers.get(COMPUTE_HEADER)
                                if compute_ms is not None:
                                    ctx["compute_s"] = float(compute_ms) / 1000
                                    metrics.compute_seconds.labels(ep_name, replica.pool).inc(float(compute_ms) / 1000)
                                    metrics.request_seconds.labels(ep_name, replica.pool).inc(
                                        time.monotonic() - ctx["started"])
                            if resp.status == 503 and resp.headers.get(NOT_READY_HEADER) \
                                    and not_ready < MAX_NOT_READY_TRIES:
                                # Loading, draining or its engine gone: route around it until a
                                # health check passes, hold for a ready replica, and do not count
                                # the try (after both engines of a pool died, the tries were spent
                                # on them and one past its audio budget got the last).
                                not_ready += 1
                                attempt -= 1
                                failed.add(replica.id)
                                runtime.report_unreachable(replica.id)
                                metrics.retries.labels(ep_name, replica.pool).inc()
                                continue
                            if resp.status == 503 and attempt < MAX_ATTEMPTS:
                                failed.add(replica.id)  # past its audio budget: try another
                                continue
                            out = {h: resp.headers[h] for h in _FORWARD_RESPONSE_HEADERS if h in resp.headers}
                            return resp.status, out, data
                    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                        log.warning("replica %s failed: %s", replica.id, exc, extra={"replica": replica.id, "attempt": attempt})
                        failed.add(replica.id)
                        runtime.report_unreachable(replica.id)
                        metrics.retries.labels(ep_name, replica.pool).inc()
                    finally:
                        dispatcher.release(replica.id, audio_s=audio_est)
                        for h in helpers:
                            dispatcher.release(h.id, served=False)
                        metrics.in_flight.labels(ep_name).set(dispatcher.in_flight())
                # Replicas that dropped the connection are being restarted or replaced: retry soon.
                raise UpstreamError(f"the request failed on {len(failed)} replica(s): {', '.join(sorted(failed))}; "
                                    "they are being restarted, retry the request", retry_after_s=1)
        except TimeoutError:
            raise RequestTimeoutError(
                f"the request did not finish within request_timeout_s={gw.request_timeout_s:g}", retry_after_s=None
            ) from None

    async def relay_events(request: web.Request, resp: aiohttp.ClientResponse, pool: str,
                           sent: float) -> web.StreamResponse:
        """Pass a replica's server-sent events (OpenAI ``stream=true``) on as they come. A
        replica lost mid-stream ends the stream with an error event (the status is sent)."""
        out = web.StreamResponse(headers={"Content-Type": resp.headers["Content-Type"], "Cache-Control": "no-cache",
                                          REQUEST_ID: request["request_id"]})
        await out.prepare(request)
        request["stream"] = out
        try:
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            log.warning("replica stream broke: %s", exc)
            await out.write(openai.error_event("upstream_error", "the replica serving this stream was lost; "
                                               "resend the request"))
        else:
            dispatcher.record_service(pool, clock() - sent)
        await out.write_eof()
        return out

    def check_model(name: str) -> None:
        if not spec.model.serves(name):
            raise UnknownModelError.naming(name, model, spec.model.aliases)

    def any_ready() -> bool:
        return any(e.ready for e in runtime.endpoints())

    # --- inference -----------------------------------------------------------------------
    @inference
    async def invocations(request: web.Request) -> web.StreamResponse:
        return await forward(request)

    @inference
    async def infer(request: web.Request) -> web.StreamResponse:
        check_model(request.match_info["name"])
        return await forward(request)

    @inference
    async def transcriptions(request: web.Request) -> web.StreamResponse:
        return await forward(request)

    @inference
    async def endpoint_invocations(request: web.Request) -> web.StreamResponse:
        # The SageMaker runtime API (boto3 invoke_endpoint with endpoint_url = this gateway).
        name = request.match_info["endpoint"]
        if name != ep_name:
            raise UnknownModelError(f"endpoint '{name}' is not served here; this gateway serves endpoint "
                                    f"'{ep_name}': POST /endpoints/{ep_name}/invocations")
        return await forward(request, "/invocations")

    # --- health and metadata ---------------------------------------------------------------
    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def live(request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(request: web.Request) -> web.Response:
        ok = runtime.accepting()
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def server_meta(request: web.Request) -> web.Response:
        return web.json_response(kserve.server_metadata(__version__))

    async def model_meta(request: web.Request) -> web.Response:
        check_model(request.match_info["name"])
        return web.json_response(kserve.model_metadata(model, spec.model.backend))

    async def model_ready(request: web.Request) -> web.Response:
        # Ready = requests for the model are accepted: true at zero replicas too (they are held
        # and wake a replica), as for /v2/health/ready; false once every pool has failed.
        check_model(request.match_info["name"])
        ok = runtime.accepting()
        return web.json_response({"name": model, "ready": ok, "replicas_ready": any_ready()}, status=200 if ok else 503)

    async def model_config(request: web.Request) -> web.Response:
        check_model(request.match_info["name"])
        return web.json_response(kserve.model_config(
            model, spec.model.backend, spec.batching.max_batch_size, spec.batching.max_queue_delay_ms,
            [(p.name, p.accelerator, p.replicas.max) for p in spec.pools]))

    async def model_stats(request: web.Request) -> web.Response:
        name = request.match_info.get("name")
        if name is not None:
            check_model(name)
        return web.json_response(stats.to_json(model))

    async def repository_index(request: web.Request) -> web.Response:
        ready_only = kserve.parse_repository_index(request.get("body", b""))  # the body read by read_unused_body
        return web.json_response(kserve.repository_index(model, runtime.accepting(), ready_only))

    async def models(request: web.Request) -> web.Response:
        return web.json_response(openai.models_response(model, request.match_info.get("model"), spec.model.aliases))

    # --- operations -------------------------------------------------------------------------
    async def metrics_h(request: web.Request) -> web.Response:
        status = runtime.status()
        metrics.replicas.clear()
        metrics.pool_state.clear()
        for pool in status["pools"]:
            for state in ("running", "failed", "unschedulable"):
                metrics.pool_state.labels(ep_name, pool["name"], state).set(1 if pool["state"] == state else 0)
            counts: dict[str, int] = {}
            for rep in pool["replicas"]:
                counts[rep["state"]] = counts.get(rep["state"], 0) + 1
            for state in ("starting", "ready", "draining", "restarting", "failed"):
                metrics.replicas.labels(ep_name, pool["name"], state).set(counts.get(state, 0))
        return web.Response(body=metrics.exposition(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def admin_status(request: web.Request) -> web.Response:
        status = runtime.status()
        for pool in status["pools"]:
            for rep in pool["replicas"]:
                rep["outstanding"] = dispatcher.outstanding.get(rep["id"], 0)
        return web.json_response({
            "endpoint": ep_name, "model": model, "version": __version__,
            "gateway": {"pending": dispatcher.pending, "in_flight": dispatcher.in_flight(),
                        "grpc_port": request.app.get("grpc_port"),
                        "max_pending": gw.max_pending, "request_timeout_s": gw.request_timeout_s,
                        "service_rates": {p: round(r, 4) for p, r in dispatcher.service_rates().items()}},
            **status,
            **(extra_status() if extra_status else {}),
        })

    async def admin_sd(request: web.Request) -> web.Response:
        return web.json_response(runtime.scrape_targets())

    add_api_routes(app.router, ApiHandlers(
        ping=ping, invocations=invocations, live=live, ready=ready, server_metadata=server_meta,
        model_metadata=model_meta, model_ready=model_ready, infer=infer, transcriptions=transcriptions,
        translations=transcriptions,  # forwarded as it came: the worker tells the two apart
        models=models, metrics=metrics_h,
    ))
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        app.router.add_get(prefix + "/config", model_config)
        app.router.add_get(prefix + "/stats", model_stats)
    app.router.add_get("/v2/models/stats", model_stats)
    app.router.add_post("/v2/repository/index", repository_index)
    app.router.add_post("/endpoints/{endpoint}/invocations", endpoint_invocations)
    app.router.add_get("/admin/status", admin_status)
    app["core"] = GatewayCore(endpoint, stats, call, account, dispatcher.arrived, key_ok, runtime.accepting)
    app.router.add_get("/admin/sd", admin_sd)
    return app
