"""``hf://org/name@revision`` → a snapshot directory in the Hugging Face cache (the only importer
of huggingface_hub).

The model lives in the Hub's own cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``), not in tideserve's cache_dir, so what ``hf download`` or another
library fetched is shared. huggingface_hub does the integrity and atomicity there: a blob is
written as ``*.incomplete`` and renamed when complete, LFS blobs are checked against their
SHA-256, and a file lock per blob makes concurrent processes download it once (huggingface_hub
docs, "Manage the cache"; ``file_download.py``).

Offline: the cache is consulted first with ``local_files_only=True`` (no network at all). A
commit-hash revision found there is final (immutable). A branch or tag found there is final
when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set, read at call time; otherwise the
Hub is asked what the branch points to now and anything missing is downloaded. The revision
defaults to ``main``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tideserve.errors import SourceError
from tideserve.sources.errors import SourceAuthError, SourceNetworkError, SourceNotFoundError

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TRUE = {"1", "on", "yes", "true"}


def parse_hf_uri(uri: str) -> tuple[str, str]:
    """``(repo_id, revision)`` of ``hf://org/name@revision`` (revision ``main`` when absent)."""
    rest = uri.removeprefix("hf://").strip("/")
    repo_id, _, revision = rest.partition("@")
    if not repo_id:
        raise SourceError(f"{uri}: a Hugging Face source is hf://<org>/<name>[@<revision>]; the repo is missing")
    return repo_id, revision or "main"


def hf_cache_dir() -> Path:
    """The Hub cache as huggingface_hub would pick it, but read from the environment now."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "huggingface" / "hub"


def _endpoint() -> str | None:
    """``HF_ENDPOINT`` as set now (a mirror or a private Hub); None for huggingface_hub's default."""
    return os.environ.get("HF_ENDPOINT") or None


def hf_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set to 1/on/yes/true."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _TRUE


def resolve_hf(uri: str) -> tuple[Path, bool]:
    """``(snapshot directory, cache hit)`` for ``uri``.

    Raises SourceNotFoundError (no such repo or revision; not cached while offline),
    SourceAuthError (gated or private repo without a valid HF_TOKEN), SourceNetworkError (the
    Hub cannot be reached and the snapshot is not cached), SourceError (malformed repo id).
    """
    repo_id, revision = parse_hf_uri(uri)
    cache = hf_cache_dir()
    offline = hf_offline()
    cached: Path | None = None
    try:
        cached = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:  # also IncompleteSnapshotError: a snapshot missing files
        if offline:
            raise SourceNotFoundError(
                f"{uri}: revision '{revision}' of {repo_id} is not (completely) in the Hugging Face cache {cache} "
                f"and HF_HUB_OFFLINE is set: fetch it where the Hub is reachable (hf download {repo_id} "
                f"--revision {revision}, with HF_HUB_CACHE={cache}) or unset HF_HUB_OFFLINE"
            ) from None
    except HFValidationError as e:
        raise SourceError(f"{uri}: '{repo_id}' is not a valid Hugging Face repo id ({e})") from None
    if cached is not None and (offline or _COMMIT.match(revision)):
        return cached, True
    try:
        path = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, endpoint=_endpoint()))
    except GatedRepoError:
        raise SourceAuthError(
            f"{uri}: {repo_id} is gated: accept its terms on its Hub page and set HF_TOKEN to a token of that account"
        ) from None
    except RepositoryNotFoundError:
        raise SourceNotFoundError(
            f"{uri}: no repo {repo_id} on the Hub (or it is private: set HF_TOKEN to a token that can read it)"
        ) from None
    except RevisionNotFoundError:
        raise SourceNotFoundError(f"{uri}: {repo_id} has no revision '{revision}': check the branch, tag or commit") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status in (401, 403):
            raise SourceAuthError(f"{uri}: the Hub refused access to {repo_id} (HTTP {status}): set HF_TOKEN") from None
        raise SourceNetworkError(f"{uri}: the Hub answered HTTP {status} for {repo_id}; retry later ({e})") from None
    except Exception as e:
        if not isinstance(e, (LocalEntryNotFoundError, OSError)) and not _is_transport_error(e):
            raise
        raise SourceNetworkError(
            f"{uri}: cannot reach the Hub ({_endpoint() or 'https://huggingface.co'}) and "
            f"{repo_id}@{revision} is not in the cache {cache} ({type(e).__name__}: {e}); check the network or "
            "HF_ENDPOINT, or prefetch it and set HF_HUB_OFFLINE=1"
        ) from None
    return path, path == cached


def _is_transport_error(e: BaseException) -> bool:
    """Whether ``e`` comes from the HTTP client huggingface_hub uses (requests, httpx or httpx2 by
    version); matched by module so that this module imports no HTTP library itself."""
    return type(e).__module__.split(".")[0] in ("requests", "urllib3", "httpx", "httpx2", "httpcore")
