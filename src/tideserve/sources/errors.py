"""The ways fetching a model can fail, each a :class:`~tideserve.errors.SourceError`.

Callers that only care that the model could not be had catch ``SourceError``; those that
want to react (retry later, ask for credentials) catch the subclass. ``retryable`` says
whether the same call may succeed later without anyone changing anything.
"""

from __future__ import annotations

from tideserve.errors import SourceError


class SourceNotFoundError(SourceError):
    """The bucket, prefix, object, repository or revision does not exist (or holds nothing)."""

    code = "source_not_found"
    retryable = False


class SourceAuthError(SourceError):
    """The credentials are missing, unknown, wrong (bad signature) or not allowed (403)."""

    code = "source_auth"
    retryable = False


class SourceNetworkError(SourceError):
    """The endpoint could not be reached or stopped answering (connect/read timeout, refused)."""

    code = "source_network"
    retryable = True


class SourceIntegrityError(SourceError):
    """A downloaded file's size or checksum differs from what the source says it should be,
    or the source changed during the download. Nothing was published."""

    code = "source_integrity"
    retryable = True
