"""Error types shared by every part of tideserve.

Each error carries a stable machine-readable ``code`` (used in JSON error bodies and
metrics labels) and the HTTP status it maps to when it reaches a client. Messages are
written for the person who sent the request: they name what was wrong and how to fix it.

This module imports nothing from tideserve (an import-linter contract checks it).
"""

from __future__ import annotations

from collections.abc import Sequence


class TideserveError(Exception):
    """Base class. ``code`` is stable; ``http_status`` is what a server answers with."""

    code: str = "internal"
    http_status: int = 500

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class SpecError(TideserveError):
    """An InferenceEndpoint (or local config) file is invalid.

    ``problems`` lists ``(path, message)`` pairs, the path in dotted form such as
    ``spec.pools[0].replicas.min``; ``str(err)`` renders them one a line.
    """

    code = "invalid_spec"
    http_status = 400

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        self.problems = problems or []
        if self.problems:
            lines = [message] + [f"  {path}: {msg}" for path, msg in self.problems]
            message = "\n".join(lines)
        super().__init__(message)


class SourceError(TideserveError):
    """A model source could not be resolved or fetched (missing, not allowed, unsupported).

    ``retryable``: the same fetch may succeed later with nothing changed (network, integrity).
    """

    code = "source_error"
    http_status = 500
    retryable = False


class EngineMismatchError(TideserveError):
    """An engine was built for a target this device cannot run (e.g. sm_86 on sm_89)."""

    code = "engine_mismatch"
    http_status = 500


class CapacityError(TideserveError):
    """No capacity: the pending queue is full or no replica became ready in time (503)."""

    code = "unavailable"
    http_status = 503


class ReplicaNotReadyError(CapacityError):
    """This replica cannot serve now: it is loading or draining, or its engine process died or
    cannot be reached (503). Its answer carries ``protocol.internal.NOT_READY_HEADER``, so the
    gateway routes around the replica until a health check passes and tries another without
    counting the try (a 503 for a full audio budget is counted)."""


class BadInputError(TideserveError):
    """The request is malformed: bad JSON, missing field, undecodable audio (400)."""

    code = "bad_input"
    http_status = 400


class LanguageMismatchError(TideserveError):
    """The speech is in a language the model cannot transcribe, and the endpoint rejects such
    requests (``model.language_id.on_other_language: reject``; 422)."""

    code = "language_mismatch"
    http_status = 422


class UnknownModelError(TideserveError):
    """The request names a model this endpoint does not serve (404)."""

    code = "unknown_model"
    http_status = 404

    @classmethod
    def naming(cls, name: str, served: str, aliases: Sequence[str] = ()) -> UnknownModelError:
        """The error for a request naming ``name`` where the endpoint serves ``served``, also
        known as ``aliases`` (which the message lists: OpenAI clients send ``whisper-1``)."""
        also = f" (also as {', '.join(repr(a) for a in aliases)})" if aliases else ""
        shown = name if len(name) <= 80 else name[:80] + f"... ({len(name)} characters)"  # a 10 MB name is not echoed
        return cls(f"model '{shown}' is not served here; this endpoint serves '{served}'{also}")


class PayloadTooLargeError(TideserveError):
    """The request body exceeds ``gateway.max_body_bytes`` (413)."""

    code = "too_large"
    http_status = 413


class UnauthorizedError(TideserveError):
    """API keys are configured and the request carries no valid ``Authorization: Bearer`` (401)."""

    code = "unauthorized"
    http_status = 401


class RequestTimeoutError(TideserveError):
    """The request did not finish within ``gateway.request_timeout_s`` (504)."""

    code = "timeout"
    http_status = 504


class ClientTimeoutError(TideserveError):
    """The client went silent while sending its request body for longer than
    ``gateway.idle_timeout_s`` (408)."""

    code = "client_timeout"
    http_status = 408


class TooManyConnectionsError(TideserveError):
    """One client address holds ``gateway.max_connections_per_client`` connections already (429)."""

    code = "too_many_connections"
    http_status = 429


class UpstreamError(TideserveError):
    """A replica failed to answer (connection refused or reset) and retries ran out (502, with
    Retry-After: replicas that died are restarted or replaced)."""

    code = "upstream_error"
    http_status = 502


class MissingExtraError(TideserveError):
    """A feature needs an optional extra that is not installed (``pip install 'tideserve[EXTRA]'``);
    ``extra`` names it. An installation problem, not a request's: servers answer 500 and commands
    exit with EX_CONFIG (78)."""

    code = "missing_extra"
    http_status = 500

    def __init__(self, message: str, extra: str = "") -> None:
        super().__init__(message)
        self.extra = extra
