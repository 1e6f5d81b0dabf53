"""JSON error bodies, one shape for all APIs plus each API's own error key.

Every error body has ``code`` (stable, from :mod:`tideserve.errors`), ``message`` and
``request_id``. KServe clients (tritonclient) read ``error`` as a string; OpenAI clients read
``error`` as an object with ``message``/``type``/``code``: those keys are added per API.
"""

from __future__ import annotations

import json
import math
from typing import Literal

from tideserve.errors import TideserveError

ApiFamily = Literal["sagemaker", "kserve", "openai", "admin"]


def api_family(path: str) -> ApiFamily:
    """Which API a request path belongs to (decides the error body's extra keys)."""
    if path.startswith("/v2"):
        return "kserve"
    if path.startswith("/v1/"):
        return "openai"
    if path.startswith("/admin"):
        return "admin"
    return "sagemaker"


def error_body(family: ApiFamily, code: str, message: str, request_id: str | None, status: int = 400) -> dict:
    body: dict = {"code": code, "message": message, "request_id": request_id}
    if family == "kserve":
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
    body = json.dumps(error_body(family, err.code, err.message, request_id, err.http_status)).encode()
    return err.http_status, headers, body
