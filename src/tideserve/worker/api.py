"""The worker's HTTP server: one replica serving the three APIs over one model.

Routes (same as the gateway's, so a client can talk to either):
``GET /ping``, ``POST /invocations``; KServe v2 ``/v2/health/{live,ready}``, ``/v2``,
``/v2/models/{name}[/versions/{v}][/ready]``, ``POST .../infer``; OpenAI
``POST /v1/audio/transcriptions``, ``GET /v1/models``; ``GET /metrics``; ``GET /admin/worker``.

A request is decoded (PyAV), cut into <= 30 s windows, and its windows go through the
dynamic batcher. If the client disconnects, aiohttp cancels the handler and the request's
queued windows are dropped before execution.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass

from aiohttp import web

from tideserve import __version__
from tideserve.errors import (
    BadInputError,
    CapacityError,
    PayloadTooLargeError,
    TideserveError,
    UnauthorizedError,
    UnknownModelError,
)
from tideserve.httpcommon import ApiHandlers, add_api_routes, request_id_and_errors
from tideserve.metrics.gpu import GpuMetrics
from tideserve.metrics.triton import TritonMetrics
from tideserve.protocol import TranscriptionRequest, TranscriptionResult, kserve, openai, sagemaker
from tideserve.worker.audio import SAMPLE_RATE, decode_audio
from tideserve.worker.backends.base import Backend, WindowResult, WindowTask
from tideserve.worker.batcher import DynamicBatcher, Usage
from tideserve.worker.windows import split_windows

log = logging.getLogger("tideserve.worker")
TOKEN_HEADER = "X-Tideserve-Token"
#: Model time (ms) the request's windows used, summed over the executions they ran in.
COMPUTE_HEADER = "X-Tideserve-Compute-Ms"
#: Most extra decoding rounds for window tails that Whisper left unfinished (each round's tails
#: are shorter than the window they come from, so this only bounds pathological cases).
MAX_TAIL_ROUNDS = 2


@dataclass
class WorkerState:
    ready: bool = False
    draining: bool = False
    in_flight: int = 0


class WorkerService:
    """Transcription on top of a backend and a batcher; no HTTP here."""

    def __init__(self, model_name: str, backend: Backend, batcher: DynamicBatcher, metrics: TritonMetrics,
                 max_audio_s: float | None = None, max_prompt_chars: int | None = None) -> None:
        self.model_name = model_name
        self.max_audio_s = max_audio_s
        self.max_prompt_chars = max_prompt_chars
        self.backend = backend
        self.batcher = batcher
        self.metrics = metrics
        self.state = WorkerState()

    async def transcribe(self, req: TranscriptionRequest, usage: Usage | None = None) -> TranscriptionResult:
        """Decode, window and batch one request. ``usage`` collects the model time it used.
        Raises BadInputError for bad audio or a language the model does not know."""
        if self.max_prompt_chars is not None and req.prompt and len(req.prompt) > self.max_prompt_chars:
            raise BadInputError(
                f"prompt is {len(req.prompt)} characters, over the limit of {self.max_prompt_chars} "
                "(spec.gateway.max_prompt_chars); Whisper uses only the last 223 tokens of a prompt"
            )
        if req.language is not None and req.language not in self.backend.languages:
            known = ", ".join(sorted(self.backend.languages)[:12])
            more = "..." if len(self.backend.languages) > 12 else ""
            raise BadInputError(f"language '{req.language}' is not supported by model '{self.model_name}'; use one of {known}{more}")
        samples = await asyncio.get_running_loop().run_in_executor(None, decode_audio, req.audio, self.max_audio_s)
        windows = split_windows(samples, SAMPLE_RATE)
        tasks = [WindowTask(w.samples, w.offset_s, req.prompt, req.language, req.timestamps) for w in windows]
        self.metrics.add("tideserve_worker_requests_in_batcher", 1)
        try:
            results = await self._decode(tasks, usage)
        finally:
            self.metrics.add("tideserve_worker_requests_in_batcher", -1)
        return TranscriptionResult(
            text=" ".join(r.text for r in results if r.text),
            language=results[0].language,
            duration_s=len(samples) / SAMPLE_RATE,
            segments=[s for r in results for s in r.segments],
        )


    async def _decode(self, tasks: list[WindowTask], usage: Usage | None,
                      rounds_left: int = MAX_TAIL_ROUNDS) -> list[WindowResult]:
        """Decode windows in one batched round; where a window stopped short of its end
        (Whisper leaves unfinished speech for the next seek), decode the rest of that window
        in a further round, batched with the other tails, and splice it in after its window."""
        results: list[WindowResult] = await self.batcher.submit_many(tasks, usage)
        tails = [
            (i, WindowTask(t.samples[int(r.unfinished_from_s * SAMPLE_RATE):], t.offset_s + r.unfinished_from_s,
                           t.prompt, t.language, t.timestamps))
            for i, (t, r) in enumerate(zip(tasks, results))
            if r.unfinished_from_s is not None
        ]
        if not tails or rounds_left <= 0:
            return results
        tail_results = await self._decode([t for _, t in tails], usage, rounds_left - 1)
        out: list[WindowResult] = []
        extra = dict(zip((i for i, _ in tails), tail_results))
        for i, r in enumerate(results):
            out.append(r)
            if i in extra:
                out.append(extra[i])
        return out


def build_app(service: WorkerService, max_body_bytes: int, token: str | None = None,
              platform: str = "faster-whisper") -> web.Application:
    """The aiohttp application of one worker. ``token``, when set, must be sent by callers in
    the ``X-Tideserve-Token`` header (the gateway does) on every route but the two health
    probes, which kubelet calls without secrets, and ``/metrics``, which Prometheus scrapes
    directly; a missing, wrong or malformed (non-UTF-8) token is a 401."""
    open_paths = ("/v2/health/live", "/v2/health/ready", "/metrics")
    expected = token.encode() if token else b""

    @web.middleware
    async def internal_token(request: web.Request, handler):
        if token and request.path not in open_paths:
            # aiohttp decodes header bytes that are not UTF-8 as surrogate escapes: encode them
            # back the same way, so such a token is compared (and refused), not a crash.
            sent = request.headers.get(TOKEN_HEADER, "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(sent, expected):
                raise UnauthorizedError("this worker only takes requests from its gateway")
        return await handler(request)

    @web.middleware
    async def compute_header(request: web.Request, handler):
        resp = await handler(request)
        usage = request.get("usage")
        if usage is not None:
            resp.headers[COMPUTE_HEADER] = f"{usage.compute_s * 1000:.3f}"
        return resp

    app = web.Application(client_max_size=max_body_bytes,
                          middlewares=[request_id_and_errors, internal_token, compute_header])
    name = service.model_name
    st = service.state

    def ready() -> bool:
        return st.ready and not st.draining

    def check_model(model: str) -> None:
        if model != name:
            raise UnknownModelError(f"model '{model}' is not served here; this endpoint serves '{name}'")

    def check_accepting() -> None:
        if not ready():
            raise CapacityError("replica is not ready (loading or draining); retry on another replica", retry_after_s=1)

    async def run(request: web.Request, req: TranscriptionRequest) -> TranscriptionResult:
        st.in_flight += 1
        started = time.monotonic()
        usage = Usage()
        request["usage"] = usage
        try:
            result = await service.transcribe(req, usage)
        except (BadInputError, PayloadTooLargeError):
            service.metrics.on_request(False, time.monotonic() - started, "REJECTED")
            raise
        except asyncio.CancelledError:
            service.metrics.on_request(False, time.monotonic() - started, "CANCELED")
            log.info("client went away; request dropped")
            raise
        except TideserveError:
            service.metrics.on_request(False, time.monotonic() - started, "OTHER")
            raise
        except Exception:
            service.metrics.on_request(False, time.monotonic() - started, "BACKEND")
            raise
        finally:
            st.in_flight -= 1
        elapsed = time.monotonic() - started
        service.metrics.on_request(True, elapsed)
        log.info("transcribed", extra={"audio_s": round(result.duration_s, 3), "duration_ms": round(elapsed * 1000, 1)})
        return result

    # --- SageMaker style -------------------------------------------------------------
    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready" if ready() else "not ready"}, status=200 if ready() else 503)

    async def invocations(request: web.Request) -> web.Response:
        check_accepting()
        req = sagemaker.parse_invocation(await request.read())
        return web.json_response(sagemaker.format_invocation(await run(request, req)))

    # --- KServe v2 ---------------------------------------------------------------------
    async def live(request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready_h(request: web.Request) -> web.Response:
        return web.json_response({"ready": ready()}, status=200 if ready() else 503)

    async def server_meta(request: web.Request) -> web.Response:
        return web.json_response(kserve.server_metadata(__version__))

    async def model_meta(request: web.Request) -> web.Response:
        check_model(request.match_info["name"])
        return web.json_response(kserve.model_metadata(name, platform))

    async def model_ready(request: web.Request) -> web.Response:
        check_model(request.match_info["name"])
        return web.json_response({"name": name, "ready": ready()}, status=200 if ready() else 503)

    async def infer(request: web.Request) -> web.Response:
        check_model(request.match_info["name"])
        check_accepting()
        parsed = kserve.parse_infer(await request.read(), request.headers.get(kserve.HEADER_LENGTH))
        result = await run(request, parsed.request)
        body, headers, ctype = kserve.format_infer(name, parsed, result)
        return web.Response(body=body, headers=headers, content_type=ctype)

    # --- OpenAI style ------------------------------------------------------------------
    async def transcriptions(request: web.Request) -> web.Response:
        check_accepting()
        if not request.content_type.startswith("multipart/form-data"):
            raise BadInputError("send multipart/form-data with fields 'file' and 'model'")
        try:
            form = await request.post()
        except web.HTTPRequestEntityTooLarge:
            raise
        except (ValueError, LookupError, RuntimeError, UnicodeError, web.HTTPException) as exc:
            # aiohttp raises many kinds for a broken multipart body (bad charset, unknown
            # transfer encoding, invalid or over-long part headers): all are the client's.
            raise BadInputError(f"malformed multipart body ({type(exc).__name__}: {exc})") from None
        except Exception as exc:  # noqa: BLE001 - aiohttp's parser errors have no common base
            if type(exc).__module__.startswith("aiohttp"):
                raise BadInputError(f"malformed multipart body ({type(exc).__name__}: {exc})") from None
            raise
        fields: dict[str, str] = {}
        file_bytes = None
        for key, value in form.items():
            if isinstance(value, web.FileField):
                if key == "file":
                    file_bytes = value.file.read()
            else:
                fields[key] = str(value)
        req, fmt = openai.parse_form(fields, file_bytes, name)
        body, ctype = openai.format_response(await run(request, req), fmt)
        return web.Response(body=body, headers={"Content-Type": ctype})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "tideserve"}]})

    # --- operations ----------------------------------------------------------------------
    gpus = GpuMetrics()

    async def metrics(request: web.Request) -> web.Response:
        body = gpus.render().encode() + service.metrics.render()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def admin(request: web.Request) -> web.Response:
        return web.json_response({
            "model": name, "ready": st.ready, "draining": st.draining, "in_flight": st.in_flight,
            "queued_windows": service.batcher.queued, "executions": service.batcher.executions,
        })

    add_api_routes(app.router, ApiHandlers(
        ping=ping, invocations=invocations, live=live, ready=ready_h, server_metadata=server_meta,
        model_metadata=model_meta, model_ready=model_ready, infer=infer, transcriptions=transcriptions,
        models=models, metrics=metrics,
    ))
    app.router.add_get("/admin/worker", admin)
    return app
