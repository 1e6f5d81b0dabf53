"""Sources that are already on this machine: ``pkg://`` and ``file://`` (no download, no cache).

- ``pkg://<import package>/<subpath>``: a model shipped inside an installed Python package.
- ``file:///path``: a local or shared file system (FSx for Lustre, NFS); the path must lie
  under one of the configured ``allowed_file_roots`` (after resolving ``..`` and links).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from urllib.parse import unquote, urlparse

from tideserve.errors import SourceError
from tideserve.sources.errors import SourceNotFoundError


def resolve_pkg(uri: str) -> Path:
    """The directory ``subpath`` inside installed package ``package``. Raises SourceNotFoundError
    when either is missing, SourceError when ``subpath`` leaves the package."""
    rest = uri.removeprefix("pkg://")
    package, _, subpath = rest.partition("/")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SourceNotFoundError(
            f"{uri}: no installed Python package '{package}'; install it (pip install ...) or fix the name"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    path = (root / subpath).resolve()
    if root.resolve() not in (path, *path.parents):
        raise SourceError(f"{uri}: subpath '{subpath}' leaves the package directory")
    if not path.exists():
        raise SourceNotFoundError(f"{uri}: package '{package}' has no '{subpath}' (looked in {path})")
    return path


def resolve_file(uri: str, allowed_roots: list[Path]) -> Path:
    """The path of ``file:///abs/path`` once resolved (``..``, symlinks); it must lie under one of
    ``allowed_roots``. Raises SourceError (outside the roots, remote host), SourceNotFoundError."""
    parsed = urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise SourceError(f"{uri}: file:// URIs name a local path (file:///abs/path), not host '{parsed.netloc}'")
    path = Path(unquote(parsed.path)).resolve()
    roots = [Path(r).resolve() for r in allowed_roots]
    if not any(r == path or r in path.parents for r in roots):
        allowed = ", ".join(str(r) for r in roots) or "none configured"
        raise SourceError(
            f"{uri}: {path} is outside the allowed file roots ({allowed}); add its directory to "
            "allowed_file_roots in the local config"
        )
    if not path.exists():
        raise SourceNotFoundError(f"{uri}: {path} does not exist")
    return path
