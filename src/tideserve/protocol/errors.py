"""JSON error bodies, one shape for all APIs plus each API's own error key.

Every error body has ``code``, ``message`` and ``request_id``. ``code`` is the stable error
code (a string from :mod:`tideserve.errors`, e.g. ``bad_input``) everywhere but the SageMaker
style routes, where ``code`` is always an integer, as in their success answer (``0``): there
it is the HTTP status and the stable string is in ``error``. KServe clients (tritonclient) read
``error`` as a string (the message); OpenAI clients read ``error`` as an object with
``message``/``type``/``code``.
"""

from __future__ import annotations

import json
import math
from typing import Literal

from tideserve.errors import ReplicaNotReadyError, TideserveError
from tideserve.protocol.internal import NOT_READY_HEADER

ApiFamily = Literal["sagemaker", "kserve", "openai", "admin"]


def api_family(path: str) -> ApiFamily:
    """Which API a request path belongs to (decides the error body's keys): ``admin`` is
    everything that is not one of the three inference APIs (operations, unknown paths)."""
    if path.startswith("/v2"):
        return "kserve"
    if path.startswith("/v1/"):
        return "openai"
    if path in ("/invocations", "/ping") or path.startswith("/endpoints/"):
        return "sagemaker"
    return "admin"


def error_body(family: ApiFamily, code: str, message: str, request_id: str | None, status: int = 400) -> dict:
    """The JSON error body of ``family`` for stable error ``code`` answered with HTTP ``status``."""
    body: dict = {"code": code, "message": message, "request_id": request_id}
    if family == "sagemaker":
        body["code"], body["error"] = status, code
    elif family == "kserve":
        body["error"] = message
    elif family == "openai":
        body["error"] = {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                         "param": None, "code": code}
    return body


def error_response_parts(
    family: ApiFamily, err: TideserveError, request_id: str | None
) -> tuple[int, dict[str, str], bytes]:
    """(HTTP status, extra headers, JSON body bytes) for ``err``."""
    headers: dict[str, str] = {}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
    if isinstance(err, ReplicaNotReadyError):
        headers[NOT_READY_HEADER] = "1"
    if err.http_status == 401:  # RFC 6750, section 3: the scheme the client must use
        headers["WWW-Authenticate"] = 'Bearer realm="tideserve"'
    body = json.dumps(error_body(family, err.code, err.message, request_id, err.http_status)).encode()
    return err.http_status, headers, body
