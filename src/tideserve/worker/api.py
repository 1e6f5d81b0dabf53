"""The worker's HTTP server: one replica serving the three APIs over one model.

Routes (same as the gateway's, so a client can talk to either):
``GET /ping``, ``POST /invocations``; KServe v2 ``/v2/health/{live,ready}``, ``/v2``,
``/v2/models/{name}[/versions/{v}][/ready]``, ``POST .../infer``; OpenAI
``POST /v1/audio/transcriptions``, ``GET /v1/models``; ``GET /metrics``; ``GET /admin/worker``.

A request's body is parsed and its audio decoded and cut into <= 30 s windows in a prep
process (``worker.prep``); its windows are decoded by the engine process (``worker.engine``).
This process only does HTTP. If the client disconnects, aiohttp cancels the handler and the
engine drops the request's queued windows and stops its decoding rows.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import MultiDictProxy

from tideserve import __version__
from tideserve.errors import (
    BadInputError,
    CapacityError,
    ReplicaNotReadyError,
    LanguageMismatchError,
    PayloadTooLargeError,
    TideserveError,
    UnauthorizedError,
    UnknownModelError,
)
from tideserve.httpcommon import OPENAPI_PATH_VALUES, OPENAPI_TITLE, REQUEST_ID, ApiHandlers, add_api_routes, request_id_and_errors
from tideserve.metrics.gpu import GpuMetrics
from tideserve.metrics.triton import TritonMetrics
from tideserve.protocol import TranscriptionRequest, TranscriptionResult, kserve, openai, sagemaker
from tideserve.protocol.internal import (
    COMPUTE_HEADER,
    PART_AUDIO,
    PART_OPTIONS,
    PART_PATH,
    PARTS_HEADER,
    SPREAD_HEADER,
    TOKEN_HEADER,
    joined,
    part_request,
    part_options,
    result_from_json,
    result_to_json,
)
from tideserve.protocol.types import identification_headers
from tideserve.worker.timings import Usage
from tideserve.worker.engine import RequestOptions
from tideserve.worker.engine_client import EngineClient
from tideserve.worker.language_id import mismatch_message
from tideserve.worker.longform import decodes_timestamps
from tideserve.worker.prep import (
    Prepared,
    PrepPool,
    PrepProcessDied,
    RemotePart,
    prepare_audio,
    prepare_for_engine,
    prepare_infer,
    prepare_invocation,
    prepare_spread,
)

log = logging.getLogger("tideserve.worker")

#: ``on_text(index, texts, complete)``: a window's (or a stretch's, or a remote part's) non-empty
#: texts so far, for a stream's deltas (``openai.DeltaOrder.add``).
OnText = Callable[[int, list[str], bool], None]

#: A spread file's helper is given up (its part transcribed by the receiving replica) once it is
#: this many times the receiving replica's own part's time late, and at least ``spread_part_grace_s``
#: (``spec.gateway``; default PART_GRACE_MIN_S s).
PART_GRACE_FACTOR = 3.0
PART_GRACE_MIN_S = 30.0


class AudioBudget:
    """Decoded audio a replica holds at once, in seconds of audio (issue 15: memory bounded by the
    audio). ``take(seconds)`` reserves, ``give(seconds)`` returns; a reservation that would pass
    ``capacity_s`` is refused, unless nothing is held (so one file up to ``max_audio_s`` always
    runs). Held memory is then at most ``capacity_s`` x 32 KB/s (int16 PCM, 16 kHz, in the engine;
    prep processes hand it there, so this process holds none), plus the files the prep processes
    are decoding and at most one decoded file per prep process waiting for this check.
    Raises ValueError for a capacity <= 0."""

    def __init__(self, capacity_s: float) -> None:
        if capacity_s <= 0:
            raise ValueError(f"the audio budget must be > 0 s, got {capacity_s}")
        self.capacity_s = capacity_s
        self.held_s = 0.0

    def take(self, seconds: float) -> bool:
        if self.held_s > 0 and self.held_s + seconds > self.capacity_s:
            return False
        self.held_s += seconds
        return True

    def give(self, seconds: float) -> None:
        self.held_s = max(0.0, self.held_s - seconds)


@dataclass
class WorkerState:
    ready: bool = False
    draining: bool = False
    in_flight: int = 0


class WorkerService:
    """Transcription on top of the prep processes and the engine process; no HTTP here.

    ``prep`` runs parsing and audio decoding (``PrepPool``), ``engine`` the model
    (``EngineClient``); ``languages`` are the model's (from the engine once it has loaded).
    ``spread_min_audio_s`` (``spec.gateway``; 0: off): a file at least this long, sent with idle
    replicas in ``SPREAD_HEADER``, is cut into parts of at least half this length whose later
    parts go to those replicas (``PART_PATH``, with ``token``); a part a replica fails, or has
    not answered ``spread_part_grace_s`` seconds after this replica's own part (or 3x its time,
    when longer), is transcribed here instead. ``without_timestamps`` (the endpoint's): a spread
    file's parts, this replica's included, decode with timestamp tokens when the whole file would
    (``longform.decodes_timestamps``), so that a part of one window reads as it would in one piece."""

    def __init__(self, model_name: str, prep: PrepPool, engine: EngineClient, metrics: TritonMetrics,
                 max_audio_s: float | None = None, max_prompt_chars: int | None = None,
                 languages: frozenset[str] = frozenset(), max_audio_s_in_flight: float | None = None,
                 aliases: tuple[str, ...] = (), spread_min_audio_s: float = 0.0, spread_max_parts: int = 8,
                 token: str | None = None, spread_part_grace_s: float = PART_GRACE_MIN_S,
                 without_timestamps: bool | None = True) -> None:
        self.model_name = model_name
        self.without_timestamps = without_timestamps
        self.aliases = aliases
        self.max_audio_s = max_audio_s
        cap = max_audio_s_in_flight or (2 * max_audio_s if max_audio_s else None)
        self.budget = AudioBudget(cap) if cap else None
        self.max_prompt_chars = max_prompt_chars
        self.prep = prep
        self.engine = engine
        self.metrics = metrics
        self.languages = languages
        self.state = WorkerState()
        self.spread_min_audio_s = spread_min_audio_s
        self.spread_max_parts = spread_max_parts
        self.spread_part_grace_s = spread_part_grace_s
        self.token = token
        self._session: aiohttp.ClientSession | None = None

    def helpers(self, header: str | None) -> list[str]:
        """The replica base URLs in a ``SPREAD_HEADER`` value that may take parts of this request
        (at most ``spread_max_parts - 1``); [] when spreading is off or there are none."""
        if not header or not self.spread_min_audio_s:
            return []
        urls = [u for u in (x.strip() for x in header.split(",")) if u.startswith(("http://", "https://"))]
        return urls[: self.spread_max_parts - 1]

    async def prepare_request(self, helpers: list[str], fn, *args) -> Prepared:
        """``prepare(fn, *args)``, cut into parts for ``helpers`` when there are any (``prep.spread``)."""
        if not helpers:
            return await self.prepare(fn, *args)
        return await self.prepare(prepare_spread, len(helpers) + 1, self.spread_min_audio_s / 2, fn, *args)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def check(self, req: TranscriptionRequest) -> None:
        """Raise BadInputError for a prompt over the limit or a language the model does not know."""
        if self.max_prompt_chars is not None and req.prompt and len(req.prompt) > self.max_prompt_chars:
            raise BadInputError(
                f"prompt is {len(req.prompt)} characters, over the limit of {self.max_prompt_chars} "
                "(spec.gateway.max_prompt_chars); Whisper uses only the last 223 tokens of a prompt"
            )
        if req.task == "translate" and self.languages and self.languages <= {"en"}:
            raise BadInputError(f"model '{self.model_name}' is English-only and cannot translate; serve a multilingual "
                                "model (examples/whisper-base.yaml) for translations")
        if req.language is not None and req.language not in self.languages:
            known = ", ".join(sorted(self.languages))  # every one (Whisper's 99 two-letter codes: ~400 characters)
            raise BadInputError(f"language '{req.language}' is not supported by model '{self.model_name}'; use one of "
                                f"{known} (or leave it out to detect it)" if len(self.languages) > 1 else
                                f"language '{req.language}' is not supported by model '{self.model_name}', which "
                                f"transcribes only '{known}': use '{known}' or leave the language out, or serve a "
                                "multilingual model (examples/whisper-base.yaml)")

    async def prepare(self, fn, *args) -> Prepared:
        """Run a ``worker.prep`` function in a prep process, timing the stage. When the engine
        has a handoff socket the prep process sends the audio to the engine itself
        (``prepare_for_engine``; the result's ``engine_rid`` says under which id): the caller then
        passes the result to ``transcribe`` or ``discard``. A prep process that dies is replaced
        and the request tried once more, under a new id. Raises what ``fn`` raises,
        CapacityError (503) when prep processes died twice or the engine cannot be reached."""
        t0 = time.monotonic()
        try:
            if self.prep.handoff is None or self.engine.handoff != self.prep.handoff:
                return await self.prep.run(fn, *args)
            for attempt in range(2):
                rid = self.engine.new_rid()
                try:
                    return await self.prep.run_once(prepare_for_engine, rid, fn, *args,
                                                    orphaned=self.discard)
                except PrepProcessDied:
                    # Its audio may or may not have reached the engine: drop it there (a drop
                    # that arrives first is remembered until the audio does, or never matters).
                    self.engine.drop(rid)
                    if attempt:
                        raise
            raise AssertionError("unreachable")
        finally:
            self.metrics.add("tideserve_worker_stage_duration_us", (time.monotonic() - t0) * 1e6, stage="prep")

    def discard(self, prepared: Prepared) -> None:
        """Release a prepared request that will not be transcribed (its audio in the engine)."""
        if prepared.engine_rid is not None:
            self.engine.drop(prepared.engine_rid)

    async def transcribe(self, prepared: Prepared, usage: Usage | None = None,
                         on_text: OnText | None = None,
                         helpers: list[str] | None = None, request_id: str | None = None) -> TranscriptionResult:
        """Decode the prepared request's windows in the engine, and its ``remote`` parts (a spread
        file) on ``helpers`` at the same time. ``usage`` collects the model time it used (the
        helpers' too); ``on_text(index, texts, complete)`` is called as each window (with
        timestamps, each stretch: with ``complete`` False after each of its windows, then True),
        then each remote part, is done (in any order; a remote part's index follows the
        windows'; ``texts`` the non-empty texts so far, each call's extending the last's);
        ``request_id`` goes with the parts, so that the helpers' log lines carry the client's
        request id. Raises
        BadInputError for a bad prompt or language, EngineDiedError."""
        req = prepared.request
        try:
            self.check(req)
        except BadInputError:
            self.discard(prepared)
            raise
        # A spread file is one file on several replicas: each part decodes as the whole file would.
        windows = len(prepared.cuts) + sum(len(p.cuts) for p in prepared.remote)
        timestamps = decodes_timestamps(req.timestamps, windows, self.without_timestamps)
        options = RequestOptions(req.prompt, req.language, timestamps, req.task, req.words, stream=on_text is not None)
        parts: list[asyncio.Future[TranscriptionResult | None]] = []
        # An English-only model's parts are English, identified only in the part that holds the
        # file's first sound (none when it is in the first part), as in one piece.
        english_only = self.languages == {"en"}
        opts = [part_options(req.prompt, req.language or ("en" if english_only and not p.identify else None),
                             timestamps, req.task, req.words, p.cuts) for p in prepared.remote]
        n = len(prepared.cuts)
        texts = [None if on_text is None else functools.partial(on_text, n + j) for j in range(len(prepared.remote))]
        parts = [asyncio.ensure_future(self._remote_part(url, part, o, usage, request_id))
                 for url, part, o in zip(helpers or [], prepared.remote, opts, strict=False)]
        started = time.monotonic()
        self.metrics.add("tideserve_worker_requests_in_batcher", 1)
        try:
            on_segment = None if on_text is None else (
                lambda i, chain, complete: on_text(i, [r.text for r in chain if r.text], complete))
            if prepared.engine_rid is not None:
                results, compute_s = await self.engine.transcribe_handed(
                    prepared.engine_rid, len(prepared.cuts), options, on_segment=on_segment)
            else:
                results, compute_s = await self.engine.transcribe(prepared.segments(), options, on_segment=on_segment)
            later: list[TranscriptionResult] = []
            if parts:
                # A helper that takes far longer than this part took here (stuck, or gone without
                # closing the connection) is given up and its part transcribed here.
                grace = max(self.spread_part_grace_s, PART_GRACE_FACTOR * (time.monotonic() - started))
                await asyncio.wait(parts, timeout=grace)
                for part, o, job, report in zip(prepared.remote, opts, parts, texts, strict=True):
                    got = job.result() if job.done() else None  # raises what the helper's answer raised
                    if not job.done():
                        job.cancel()
                        log.warning("a helper did not answer a part of a spread file within %.0f s; "
                                    "transcribing it here", grace)
                    self.metrics.add("tideserve_worker_spread_parts", 1, placement="helper" if got else "here")
                    if got is None:
                        got = await self._local_part(part, o, usage)
                    if report is not None:
                        report([got.text] if got.text else [], True)
                    later.append(got)
        finally:
            self.metrics.add("tideserve_worker_requests_in_batcher", -1)
            for job in parts:
                job.cancel()  # the request failed or went away: stop the parts still running
        if usage is not None:
            usage.compute_s += compute_s
        language = results[0].language if results else (req.language or "en")
        probability = results[0].language_probability if results else None
        heard = next((r for r in results if r.detected_language is not None), None)
        detected = None if heard is None else heard.detected_language
        detected_p = None if heard is None else heard.detected_language_probability
        ours = None if heard is None else heard.model_language_probability
        mismatch = heard is not None and heard.language_mismatch  # decided by the engine
        if mismatch:
            self.metrics.add("tideserve_worker_language_mismatch", 1)
            log.warning("%s", mismatch_message(detected or "", detected_p or 0.0, ours or 0.0, self.model_name))
        result = TranscriptionResult(
            text=" ".join(r.text for r in results if r.text),
            language=language,
            language_probability=probability,
            duration_s=prepared.duration_s,
            segments=[s for r in results for s in r.segments],
            detected_language=detected,
            detected_language_probability=detected_p,
            language_mismatch=mismatch,
        )
        if not later:
            return result
        return joined(result, [(p.offset_s, r) for p, r in zip(prepared.remote, later, strict=True)], prepared.duration_s)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=5))
        return self._session

    async def _local_part(self, part: RemotePart, options: str, usage: Usage | None) -> TranscriptionResult:
        """A later part of a spread file transcribed here (its helper failed)."""
        req, cuts = part_request(part.wav, options)
        sub = await self.prepare(prepare_audio, req, self.max_audio_s, None, cuts)
        return await self.transcribe(sub, usage)

    async def _remote_part(self, url: str, part: RemotePart, options: str, usage: Usage | None,
                           request_id: str | None = None) -> TranscriptionResult | None:
        """A later part of a spread file, transcribed by the replica at ``url``; None when that
        replica cannot (unreachable, not 200, a malformed answer: the caller transcribes it
        itself, so the request never depends on a helper). Times in the result are the part's own
        (from its start). Raises LanguageMismatchError when the helper heard another language
        and the endpoint rejects it."""
        result: TranscriptionResult | None = None
        headers = {**({TOKEN_HEADER: self.token} if self.token else {}), **({REQUEST_ID: request_id} if request_id else {})}
        form = aiohttp.FormData()
        form.add_field(PART_OPTIONS, options, content_type="application/json")
        form.add_field(PART_AUDIO, part.wav, filename="part.wav", content_type="audio/wav")
        try:
            async with self._client().post(url + PART_PATH, data=form, headers=headers) as resp:
                if resp.status == 200:
                    result = result_from_json(await resp.json())
                    if usage is not None and resp.headers.get(COMPUTE_HEADER):
                        usage.compute_s += float(resp.headers[COMPUTE_HEADER]) / 1000
                elif resp.status == LanguageMismatchError.http_status:  # the helper heard another language
                    doc = await resp.json()
                    if doc.get("code") == LanguageMismatchError.code:
                        raise LanguageMismatchError(str(doc.get("message", "")))
                    log.warning("replica %s answered 422 to a part of a spread file; transcribing it here", url)
                else:
                    log.warning("replica %s answered %d to a part of a spread file; transcribing it here", url,
                                resp.status)
        except (aiohttp.ClientError, ValueError, KeyError, TypeError) as exc:
            log.warning("replica %s failed a part of a spread file (%s); transcribing it here", url, exc)
        return result


#: The only route a worker answers without its gateway's token: liveness (kubelet's liveness
#: probe carries no secret, and the answer tells nothing but that the process serves HTTP).
OPEN_PATHS = frozenset({"/v2/health/live"})


async def read_form(request: web.Request, fields: str) -> MultiDictProxy:
    """The multipart/form-data body of ``request`` (``fields`` names what it must hold, for the
    error). Raises BadInputError for another content type or a broken body, HTTPRequestEntityTooLarge
    past the size limit."""
    if not request.content_type.startswith("multipart/form-data"):
        raise BadInputError(f"send multipart/form-data with fields {fields}")
    try:
        return await request.post()
    except web.HTTPRequestEntityTooLarge:
        raise
    except UnicodeDecodeError as exc:  # a text part's bytes (a file sent as text: curl -F 'file=<clip.wav')
        raise BadInputError(f"a text field of the form is not {exc.encoding} text; send the audio as a file upload "
                            "(curl -F file=@clip.wav) and text fields as UTF-8") from None
    except (ValueError, LookupError, RuntimeError, UnicodeError, web.HTTPException) as exc:
        # aiohttp raises many kinds for a broken multipart body (bad charset, unknown
        # transfer encoding, invalid or over-long part headers): all are the client's.
        raise BadInputError(f"malformed multipart body ({type(exc).__name__}: {exc})") from None
    except Exception as exc:
        if type(exc).__module__.startswith("aiohttp"):
            raise BadInputError(f"malformed multipart body ({type(exc).__name__}: {exc})") from None
        raise


def _token_matches(request: web.Request, expected: bytes) -> bool:
    """Whether the request carries ``expected`` in ``X-Tideserve-Token`` or as a Bearer
    credential, compared in constant time. aiohttp decodes header bytes that are not UTF-8 as
    surrogate escapes: they are encoded back the same way, so such a token is refused, not a crash."""
    sent = request.headers.get(TOKEN_HEADER)
    if sent is None:
        scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
        sent = credentials if scheme.lower() == "bearer" else ""
    return hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), expected)


def build_app(service: WorkerService, max_body_bytes: int, token: str | None = None,
              platform: str = "faster-whisper") -> web.Application:
    """The aiohttp application of one worker. ``token``, when set, must be sent on every route
    but the liveness probe ``/v2/health/live`` (which says only that the process answers): in
    the ``X-Tideserve-Token`` header (the gateway, the runtime's readiness checks and the
    Kubernetes readiness probe send it) or as ``Authorization: Bearer TOKEN`` (what Prometheus's
    scrape ``authorization`` sends for ``/metrics``). A missing, wrong or malformed (non-UTF-8)
    token is a 401."""
    expected = token.encode() if token else b""

    @web.middleware
    async def internal_token(request: web.Request, handler):
        if token and request.path not in OPEN_PATHS and not _token_matches(request, expected):
            raise UnauthorizedError("this worker only takes requests from its gateway")
        return await handler(request)

    @web.middleware
    async def compute_header(request: web.Request, handler):
        resp = await handler(request)
        usage = request.get("usage")
        if usage is not None and not resp.prepared:  # a stream's headers are already sent
            resp.headers[COMPUTE_HEADER] = f"{usage.compute_s * 1000:.3f}"
            if request.get("parts", 1) > 1:
                resp.headers[PARTS_HEADER] = str(request["parts"])
        return resp

    app = web.Application(client_max_size=max_body_bytes,
                          middlewares=[request_id_and_errors, internal_token, compute_header])
    app[OPENAPI_TITLE] = f"tideserve worker (model {service.model_name}; only its gateway may call it)"
    names = [service.model_name, *service.aliases]
    app[OPENAPI_PATH_VALUES] = {"name": names, "model": names}  # any version is served
    name = service.model_name
    st = service.state

    def ready() -> bool:
        return st.ready and not st.draining and not service.engine.dead

    def check_model(model: str) -> None:
        if model != name and model not in service.aliases:
            raise UnknownModelError(f"model '{model}' is not served here; this endpoint serves '{name}'")

    def check_accepting() -> None:
        if not ready():
            raise ReplicaNotReadyError("replica is not ready (loading or draining); retry on another replica",
                                       retry_after_s=1)

    async def run(request: web.Request, prep_fn, *args,
                  on_text: OnText | None = None) -> tuple[Prepared, TranscriptionResult]:
        st.in_flight += 1
        started = time.monotonic()
        usage = Usage()
        request["usage"] = usage
        held = 0.0
        helpers = service.helpers(request.headers.get(SPREAD_HEADER))
        try:
            prepared = await service.prepare_request(helpers, prep_fn, *args)
            request["parts"] = 1 + len(prepared.remote)
            budget = service.budget
            if budget is not None:
                if not budget.take(prepared.duration_s):
                    service.discard(prepared)
                    raise CapacityError(
                        f"this replica holds {budget.held_s:.0f} s of decoded audio and this request has "
                        f"{prepared.duration_s:.0f} s more, past its budget of {budget.capacity_s:g} s "
                        "(spec.gateway.max_audio_s_in_flight); retry", retry_after_s=1)
                held = prepared.duration_s
                service.metrics.set("tideserve_worker_audio_held_seconds", budget.held_s)
            result = await service.transcribe(prepared, usage, on_text, helpers, request.get("request_id"))
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
            if held and service.budget is not None:
                service.budget.give(held)
                service.metrics.set("tideserve_worker_audio_held_seconds", service.budget.held_s)
        elapsed = time.monotonic() - started
        service.metrics.on_request(True, elapsed)
        log.info("transcribed", extra={"audio_s": round(result.duration_s, 3), "duration_ms": round(elapsed * 1000, 1)})
        return prepared, result

    # --- SageMaker style -------------------------------------------------------------
    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready" if ready() else "not ready"}, status=200 if ready() else 503)

    async def invocations(request: web.Request) -> web.Response:
        check_accepting()
        _, result = await run(request, prepare_invocation, await request.read(), request.headers.get("Content-Type"),
                              service.max_audio_s)
        return web.json_response(sagemaker.format_invocation(result), headers=identification_headers(result))

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
        prepared, result = await run(request, prepare_infer, await request.read(),
                                     request.headers.get(kserve.HEADER_LENGTH), service.max_audio_s)
        body, headers, ctype = kserve.format_infer(name, prepared.extra, result)
        return web.Response(body=body, headers={**headers, **identification_headers(result)}, content_type=ctype)

    # --- OpenAI style ------------------------------------------------------------------
    async def transcriptions(request: web.Request) -> web.StreamResponse:
        return await transcribe_form(request, "transcribe")

    async def translations(request: web.Request) -> web.StreamResponse:
        return await transcribe_form(request, "translate")

    async def transcribe_form(request: web.Request, task: str) -> web.StreamResponse:
        """OpenAI ``/v1/audio/transcriptions`` (``task`` transcribe) and ``/translations``."""
        check_accepting()
        form = await read_form(request, "'file' and 'model'")
        fields: dict[str, str] = {}
        file_bytes = None
        for key, value in form.items():
            if isinstance(value, web.FileField) and key == "file":
                file_bytes = value.file.read()
            elif isinstance(value, web.FileField):  # a text field sent as a file (curl -F prompt=@prompt.txt)
                try:
                    fields[key] = value.file.read().decode("utf-8")
                except UnicodeDecodeError:
                    raise BadInputError(f"form field '{key[:40]}' was sent as a file whose bytes are not UTF-8 text; "
                                        "send it as a text field") from None
            else:
                fields[key] = str(value)
        granularities = [str(v) for v in form.getall(openai.GRANULARITIES, [])]
        req, fmt = openai.parse_form(fields, file_bytes, name, service.aliases, task, granularities)
        if req.words and platform != "faster-whisper":
            raise BadInputError(f"word timestamps are not available on the {platform} backend yet; ask for segment "
                                "timestamps (timestamp_granularities[]=segment) or serve the model with faster-whisper")
        if openai.wants_stream(fields):
            return await stream_transcription(request, req)
        _, result = await run(request, prepare_audio, req, service.max_audio_s)
        body, ctype = openai.format_response(result, fmt, task)
        return web.Response(body=body, headers={"Content-Type": ctype, **identification_headers(result)})

    async def stream_transcription(request: web.Request, req: TranscriptionRequest) -> web.StreamResponse:
        """``stream=true``: server-sent events, a delta as each window is done (with timestamps,
        each window of a stretch, ``worker.windows.STRETCH_S``, as it is accepted), in audio order,
        then the whole text. An error before the first delta is an ordinary JSON error answer;
        after it (the status line is sent), an error event ends the stream."""
        order = openai.DeltaOrder()
        deltas: asyncio.Queue[str] = asyncio.Queue()

        def on_text(index: int, texts: list[str], complete: bool) -> None:
            for d in order.add(index, texts, complete):
                deltas.put_nowait(d)

        job = asyncio.ensure_future(run(request, prepare_audio, req, service.max_audio_s, on_text=on_text))
        resp: web.StreamResponse | None = None
        getter: asyncio.Future[str] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(deltas.get())
                await asyncio.wait({getter, job}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    break  # the job ended; deltas left in the queue are sent below
                if resp is None:
                    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                       REQUEST_ID: request["request_id"]})
                    await resp.prepare(request)
                await resp.write(openai.delta_event(getter.result()))
            try:
                _, result = job.result()
            except Exception as err:
                if resp is None:
                    raise  # nothing sent yet: the usual JSON error answer
                if isinstance(err, TideserveError):
                    code, message = err.code, err.message
                else:
                    log.error("transcription failed after its stream started", exc_info=err)
                    code, message = "internal", "internal error; the server log has the details"
                await resp.write(openai.error_event(code, message))
                await resp.write_eof()
                return resp
            if resp is None:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                   REQUEST_ID: request["request_id"]})
                await resp.prepare(request)
            while not deltas.empty():
                await resp.write(openai.delta_event(deltas.get_nowait()))
            await resp.write(openai.done_event(result))
            await resp.write_eof()
            return resp
        finally:
            if getter is not None and not getter.done():
                getter.cancel()  # the handler was cancelled (client gone) while waiting
            if not job.done():
                job.cancel()

    async def models(request: web.Request) -> web.Response:
        return web.json_response(openai.models_response(name, request.match_info.get("model"), service.aliases))

    # --- a part of a spread file, from another replica -----------------------------------
    async def part(request: web.Request) -> web.Response:
        check_accepting()
        form = await read_form(request, f"'{PART_OPTIONS}' and '{PART_AUDIO}'")
        audio, options = form.get(PART_AUDIO), form.get(PART_OPTIONS)
        if isinstance(options, bytes | bytearray):  # aiohttp keeps a field that is not text/* as bytes
            try:
                options = bytes(options).decode("utf-8")
            except UnicodeDecodeError:
                raise BadInputError(f"the '{PART_OPTIONS}' field must be UTF-8 JSON") from None
        if not isinstance(audio, web.FileField) or not isinstance(options, str):
            raise BadInputError(f"send the fields '{PART_OPTIONS}' (JSON) and '{PART_AUDIO}' (a WAV file)")
        req, cuts = part_request(audio.file.read(), options)
        _, result = await run(request, prepare_audio, req, service.max_audio_s, None, cuts)
        return web.json_response(result_to_json(result))

    # --- operations ----------------------------------------------------------------------
    gpus = GpuMetrics()

    async def metrics(request: web.Request) -> web.Response:
        body = gpus.render().encode() + service.metrics.render()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def admin(request: web.Request) -> web.Response:
        return web.json_response({
            "model": name, "ready": st.ready, "draining": st.draining, "in_flight": st.in_flight,
            "engine_requests": service.engine.outstanding,
            "queued_windows": int(service.metrics.value("nv_inference_pending_request_count")),
            "executions": int(service.metrics.value("nv_inference_exec_count")),
            "prep_processes": service.prep.processes, "prep_pool_replaced": service.prep.replaced,
            "prep_pids": service.prep.pids(), "engine_pid": service.engine.process.pid,
        })

    add_api_routes(app.router, ApiHandlers(
        ping=ping, invocations=invocations, live=live, ready=ready_h, server_metadata=server_meta,
        model_metadata=model_meta, model_ready=model_ready, infer=infer, transcriptions=transcriptions,
        translations=translations,
        models=models, metrics=metrics,
    ))
    app.router.add_get("/admin/worker", admin)
    app.router.add_post(PART_PATH, part)
    return app
