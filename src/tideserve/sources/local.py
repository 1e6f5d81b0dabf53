"""Sources that are already on this machine: ``pkg://`` and ``file://`` (no download; no cache
but for a model assembled from parts).

- ``pkg://<import package>/<subpath>``: a model shipped inside an installed Python package.
- ``pkg://<pkg>/<subpath>+<pkg>/<subpath>``: a model shipped in several packages, its large files
  split into ``NAME.part1``, ``NAME.part2``, ...: assembled once into the model cache.
- ``file:///path``: a local or shared file system (FSx for Lustre, NFS); the path must lie
  under one of the configured ``allowed_file_roots`` (after resolving ``..`` and links).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

from tideserve.errors import SourceError
from tideserve.sources.cache import CHECKSUM_MANIFESTS, FileRecord, ModelCache, cache_key, parse_sha256sums, receive
from tideserve.sources.errors import SourceIntegrityError, SourceNotFoundError


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


_PART = re.compile(r"^(?P<name>.+)\.part(?P<n>[1-9][0-9]{0,3})$")


def resolve_pkg_parts(uri: str, cache_dir: Path) -> tuple[Path, bool]:
    """``pkg://<pkg>/<subpath>+<pkg>/<subpath>+...``: a model shipped in several packages (PyPI
    caps a file's size), assembled once into the model cache. Every file of the listed
    directories is taken; ``NAME.part1``, ``NAME.part2``, ... (from any of them) are joined in
    number order into ``NAME``. A ``sha256sums`` file in any of them is checked against the
    assembled files. Returns (the assembled directory, whether it was already in the cache);
    publishing is atomic (``ModelCache.fetch``).

    Raises SourceNotFoundError (a package or subpath missing), SourceError (a name in two
    directories, a subpath leaving its package), SourceIntegrityError (a part missing from a
    numbered sequence, a checksum mismatch)."""
    dirs = [resolve_pkg(f"pkg://{piece}") for piece in uri.removeprefix("pkg://").split("+")]
    whole: dict[str, Path] = {}
    parts: dict[str, dict[int, Path]] = {}
    for d in dirs:
        for f in sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            rel = f.relative_to(d).as_posix()
            m = _PART.match(rel)
            if m:
                seq = parts.setdefault(m["name"], {})
                if int(m["n"]) in seq:
                    raise SourceError(f"{uri}: {rel} is in two of the listed directories; list each part once")
                seq[int(m["n"])] = f
            elif rel in whole:
                raise SourceError(f"{uri}: {rel} is in two of the listed directories ({whole[rel].parent}, {d})")
            else:
                whole[rel] = f
    for name, seq in parts.items():
        if sorted(seq) != list(range(1, len(seq) + 1)):
            raise SourceIntegrityError(f"{uri}: {name} has parts {sorted(seq)}; parts 1..{max(seq)} must all be "
                                       "there (is a package missing from the list?)")
        if name in whole:
            raise SourceError(f"{uri}: {name} is both a file and a set of parts")
    identity = {"source": uri, "files": [[rel, f.stat().st_size, f.stat().st_mtime_ns] for rel, f in sorted(whole.items())],
                "parts": [[name, n, f.stat().st_size, f.stat().st_mtime_ns] for name, seq in sorted(parts.items())
                          for n, f in sorted(seq.items())]}

    def chunks(files: list[Path]) -> Iterator[bytes]:
        for f in files:
            with open(f, "rb") as fh:
                while block := fh.read(1 << 20):
                    yield block

    def fill(tmp: Path) -> list[FileRecord]:
        records = [receive(tmp, rel, chunks([f])) for rel, f in sorted(whole.items())]
        records += [receive(tmp, name, chunks([seq[n] for n in sorted(seq)])) for name, seq in sorted(parts.items())]
        sums = next((r for r in records if r.path in CHECKSUM_MANIFESTS), None)
        if sums is not None:
            expected = parse_sha256sums((tmp / sums.path).read_text(), f"{uri}: {sums.path}")
            got = {r.path: r.sha256 for r in records}
            bad = [p for p, h in expected.items() if got.get(p) != h]
            if bad:
                raise SourceIntegrityError(f"{uri}: assembled files do not match {sums.path}: {', '.join(bad)}")
        return records

    return ModelCache(cache_dir).fetch(cache_key(identity), uri, fill)
