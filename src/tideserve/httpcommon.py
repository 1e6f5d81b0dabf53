"""aiohttp pieces shared by the gateway and the worker: request ids and JSON errors.

Both servers answer every error as JSON (see :mod:`tideserve.protocol.errors`) with the
right status, and echo or create ``X-Request-Id`` on every response.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import uuid
from dataclasses import dataclass
from collections.abc import Awaitable, Callable
from typing import TypeGuard

from aiohttp import web

from tideserve.errors import PayloadTooLargeError, TideserveError
from tideserve.logs import request_id_var
from tideserve import __version__
from tideserve.protocol import openapi
from tideserve.protocol.errors import api_family, error_response_parts

REQUEST_ID = "X-Request-Id"
log = logging.getLogger("tideserve.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(request: web.Request, err: TideserveError) -> web.Response:
    rid = request.get("request_id")
    status, headers, body = error_response_parts(api_family(request.path), err, rid)
    if rid:
        headers[REQUEST_ID] = rid
    return web.Response(status=status, body=body, headers=headers, content_type="application/json")


_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def _valid_request_id(value: str | None) -> TypeGuard[str]:
    """Kept only if it is 1-128 characters of [A-Za-z0-9._:/+=-] (no spaces or quotes that
    could forge fields in text logs); otherwise a fresh id is made."""
    return value is not None and _REQUEST_ID_RE.fullmatch(value) is not None


def _route_hint(request: web.Request) -> str:
    """"; did you mean P?" for the route P nearest to the path asked for, else "". Candidates: the
    routes that take the request's method, under the same first segment when the path has more
    than one (``/v2/model`` is not a slip for ``/v1/models``); a route's ``{parameter}`` segments
    are compared as the request's own segments there (``/v2/models/whisper/infe`` is near
    ``/v2/models/{name}/infer``). Near: difflib's ratio of at least 0.8 ("/v1/transcriptions"
    against "/v1/audio/transcriptions" is 0.86)."""
    asked = request.path.split("/")
    candidates: dict[str, str] = {}  # the route as compared -> the route as shown
    for resource in request.app.router.resources():
        if not any(route.method in (request.method, "*") for route in resource):
            continue
        shown = resource.canonical
        parts = shown.split("/")
        if len(asked) > 2 and parts[1:2] != asked[1:2]:
            continue
        filled = [asked[i] if p.startswith("{") and i < len(asked) else p for i, p in enumerate(parts)]
        candidates["/".join(filled)] = shown
    close = difflib.get_close_matches(request.path, list(candidates), n=1, cutoff=0.8)
    return f"; did you mean {candidates[close[0]]}?" if close else ""


@web.middleware
async def request_id_and_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Set the request id (kept when the client sends a sane one), turn every error into
    JSON, and put ``X-Request-Id`` on every response."""
    incoming = request.headers.get(REQUEST_ID)
    rid = incoming if _valid_request_id(incoming) else uuid.uuid4().hex
    request["request_id"] = rid
    token = request_id_var.set(rid)
    try:
        try:
            resp = await handler(request)
        except TideserveError as err:
            return error_response(request, err)
        except web.HTTPRequestEntityTooLarge as exc:
            if "form fields" in (exc.text or ""):  # aiohttp's cap on a form's fields, not its bytes
                return error_response(request, PayloadTooLargeError(
                    f"the form has more than {request._client_max_fields} fields; send only the fields this API "
                    "takes (the file, the model and its options)"))
            return error_response(request, PayloadTooLargeError(
                f"request body is larger than the limit of {request.app._client_max_size} bytes; send a smaller file"))
        except web.HTTPNotFound:
            error = TideserveError(f"no route for {request.method} {request.path}{_route_hint(request)}")
            error.http_status, error.code = 404, "not_found"
            return error_response(request, error)
        except web.HTTPMethodNotAllowed as exc:
            error = TideserveError(f"{request.method} is not allowed on {request.path}; use {', '.join(sorted(exc.allowed_methods))}")
            error.http_status, error.code = 405, "method_not_allowed"
            resp = error_response(request, error)
            resp.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))  # RFC 9110, 15.5.6
            return resp
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            error = TideserveError(exc.reason or "error")
            error.http_status, error.code = exc.status, "http_error"
            return error_response(request, error)
        except ConnectionResetError:
            raise
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            return error_response(request, TideserveError("internal error; the server log has the details"))
        resp.headers[REQUEST_ID] = rid
        return resp
    finally:
        request_id_var.reset(token)


@dataclass(frozen=True)
class ApiHandlers:
    """The handlers of the API surface that the gateway and the worker both serve."""

    ping: Handler
    invocations: Handler
    live: Handler
    ready: Handler
    server_metadata: Handler
    model_metadata: Handler
    model_ready: Handler
    infer: Handler
    transcriptions: Handler
    translations: Handler
    models: Handler
    metrics: Handler


async def openapi_json(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the OpenAPI document of every route this server registered
    (``protocol.openapi``; built once, at the first request, when every route is in)."""
    doc = request.app.get(_OPENAPI)
    if doc is None:
        routes = [(r.method, r.resource.canonical) for r in request.app.router.routes() if r.resource is not None]
        doc = openapi.document(routes, request.app.get(OPENAPI_TITLE, "tideserve"), __version__,
                               request.app.get(OPENAPI_PATH_VALUES, {}))
        request.app[_OPENAPI] = doc
    return web.json_response(doc)


#: ``app[OPENAPI_TITLE]``: the document's title (gateway or worker); ``app[OPENAPI_PATH_VALUES]``:
#: the values each path parameter can take on this server (the served model's name, ...).
OPENAPI_TITLE = "openapi_title"
OPENAPI_PATH_VALUES = "openapi_path_values"
_OPENAPI = "openapi_document"


def add_api_routes(router: web.UrlDispatcher, h: ApiHandlers) -> None:
    """Register the shared API (DESIGN.md, "Interfaces users meet") on ``router``: SageMaker
    style, KServe v2 (with and without a version segment), OpenAI style and /metrics."""
    router.add_get("/ping", h.ping)
    router.add_post("/invocations", h.invocations)
    router.add_get("/v2/health/live", h.live)
    router.add_get("/v2/health/ready", h.ready)
    router.add_get("/v2", h.server_metadata)
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        router.add_get(prefix, h.model_metadata)
        router.add_get(prefix + "/ready", h.model_ready)
        router.add_post(prefix + "/infer", h.infer)
    router.add_post("/v1/audio/transcriptions", h.transcriptions)
    router.add_post("/v1/audio/translations", h.translations)
    router.add_get("/openapi.json", openapi_json)
    router.add_get("/v1/models", h.models)
    router.add_get("/v1/models/{model}", h.models)
    router.add_get("/metrics", h.metrics)


#: Longest error message the gateway's request log carries (``log_error_text``).
LOG_ERROR_CHARS = 200


def log_error_text(message: str | None) -> str | None:
    """``message`` for one field of a log line: its whitespace (newlines included, so a message
    holding client text cannot forge a line of a text log) collapsed to single spaces, cut to
    ``LOG_ERROR_CHARS``; None for None or an empty message."""
    if not message:
        return None
    flat = " ".join(str(message).split())
    return (flat[:LOG_ERROR_CHARS - 1] + "…") if len(flat) > LOG_ERROR_CHARS else flat or None


def error_body_message(body: bytes) -> str | None:
    """The message of an error answer's JSON body, whatever its API's shape: OpenAI's and
    tideserve's ``{"error": {"message": ...}}``, KServe's ``{"error": "..."}``, SageMaker's
    ``{"error": "<code>", "message": ...}`` (the message); None when the body is not such JSON."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    err, message = data.get("error"), data.get("message")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    if isinstance(message, str):  # SageMaker's, beside its error code
        return message
    return err if isinstance(err, str) else None
