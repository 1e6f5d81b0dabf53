"""The local content-addressed model cache: one fetch per model, verified, published atomically.

Layout under ``<cache_dir>/models/``::

    <key>/                           a published model: complete and verified, never changed again
    <key>/.tideserve-manifest.json   source URI, fetched_at, every file with size_bytes and sha256
    .locks/<key>.lock                held with fcntl.flock (exclusive) by the process fetching <key>
    .tmp/<key>.<random>/             a download in progress

``<key>`` is a digest of the source's identity (for S3: the URI and every key with its size and
ETag), so a changed model gets a new directory and an unchanged one is found again.

How a partial download is never loaded: files are written into ``.tmp/<key>.*`` and the
directory is renamed to ``<key>`` (``os.rename``, atomic within one file system, POSIX
rename(2)) only after every file's size, and each checksum the source offers, matched. A
failure removes the temporary directory; a process killed mid-download leaves it behind, and
the next fetch of the same key (holding the lock, so nobody else is writing there) removes it
before starting again. Readers only ever look at ``<key>``, which exists complete or not at all.

How replicas download once: the fetcher takes ``flock(LOCK_EX)`` on ``.locks/<key>.lock``; a
second process blocks there and, once it gets the lock, finds ``<key>`` published and returns
it. The kernel drops the lock when its holder exits, even by SIGKILL. flock needs a local file
system or one that supports it (NFSv4 emulates it with fcntl locks; Lustre with -o flock).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, UTC
from pathlib import Path, PurePosixPath

from tideserve.sources.errors import SourceIntegrityError

log = logging.getLogger("tideserve.sources")

MANIFEST_NAME = ".tideserve-manifest.json"
# Checksum manifests a model directory may carry, in GNU coreutils ``sha256sum`` format.
CHECKSUM_MANIFESTS = ("sha256sums", "SHA256SUMS")

_SUM_LINE = re.compile(r"^(?P<hex>[0-9a-fA-F]{64}) [ *](?P<path>.+)$")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/tideserve``, else ``~/.cache/tideserve`` (as ``LocalConfig.cache_dir``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tideserve"


def cache_key(identity: object) -> str:
    """32 hex characters (128 bits) of the SHA-256 of ``identity`` as canonical JSON."""
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def safe_relpath(rel: str, where: str) -> PurePosixPath:
    """``rel`` as a relative path that stays inside its directory.

    Raises SourceIntegrityError for an empty, absolute, ``.`` or ``..`` path: an object key such
    as ``model/../../etc/x`` must not write outside the download directory.
    """
    path = PurePosixPath(rel)
    if not rel or path.is_absolute() or any(part in ("", ".", "..") for part in rel.split("/")):
        raise SourceIntegrityError(f"{where}: refusing file name '{rel}' (empty, absolute, or with . or ..)")
    return path


def parse_sha256sums(text: str, where: str) -> dict[str, str]:
    """``{relative path: lowercase hex sha256}`` from ``sha256sum`` output (``HEX  path`` or
    ``HEX *path``, one a line; blank lines and ``#`` comments skipped; ``./`` prefixes dropped).

    Raises SourceIntegrityError naming the first line that is not in that format.
    """
    sums: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _SUM_LINE.match(line.rstrip("\r"))
        if m is None:
            raise SourceIntegrityError(
                f"{where} line {n} is not '<64 hex digits>  <path>' (the format of sha256sum); regenerate it "
                "with: cd <model dir> && sha256sum * > sha256sums"
            )
        path = m["path"].removeprefix("./")
        sums[str(safe_relpath(path, where))] = m["hex"].lower()
    return sums


@dataclass(frozen=True)
class FileRecord:
    """One file of a model as written to disk: ``path`` relative (POSIX), its size and SHA-256."""

    path: str
    size_bytes: int
    sha256: str


def receive(
    dest_dir: Path, rel: str, chunks: Iterable[bytes], on_chunk: Callable[[int], None] | None = None
) -> FileRecord:
    """Write ``chunks`` to ``dest_dir/rel`` (parents created), hashing as it goes; fsync before
    returning. ``on_chunk`` is called with each chunk's length after it is written."""
    path = dest_dir / safe_relpath(rel, str(dest_dir))
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            digest.update(chunk)
            size += len(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))
        f.flush()
        os.fsync(f.fileno())
    return FileRecord(rel, size, digest.hexdigest())


class ModelCache:
    """Fetched models under ``<cache_dir>/models``; see the module docstring for the layout."""

    def __init__(self, cache_dir: Path | str) -> None:
        self.root = Path(cache_dir).expanduser() / "models"

    def path(self, key: str) -> Path:
        return self.root / key

    def published(self, key: str) -> Path | None:
        """The published directory of ``key``, or None. A directory there is always complete."""
        path = self.path(key)
        return path if path.is_dir() else None

    @contextmanager
    def locked(self, key: str, uri: str) -> Iterator[None]:
        """Hold the exclusive fetch lock of ``key`` (blocks while another process holds it)."""
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{key}.lock", "a+b") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                log.info("%s: another process is fetching it; waiting for it to finish", uri)
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def fetch(self, key: str, uri: str, fill: Callable[[Path], list[FileRecord]]) -> tuple[Path, bool]:
        """The published directory of ``key`` and whether it was already there (a cache hit).

        On a miss, ``fill(tmp_dir)`` downloads every file into ``tmp_dir``, verifies what the
        source vouches for, and returns the records; then each file's size on disk is checked
        against its record, no unrecorded file may be present, the manifest is written and the
        directory renamed into place. Any exception from ``fill`` or the checks removes
        ``tmp_dir`` and propagates; nothing is published.
        """
        if (hit := self.published(key)) is not None:
            return hit, True
        with self.locked(key, uri):
            if (hit := self.published(key)) is not None:  # another process published it meanwhile
                return hit, True
            tmp_root = self.root / ".tmp"
            tmp_root.mkdir(parents=True, exist_ok=True)
            for stale in tmp_root.glob(f"{key}.*"):
                log.info("%s: removing %s left by an interrupted download", uri, stale)
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=tmp_root))
            try:
                records = fill(tmp)
                self._check_complete(tmp, records, uri)
                manifest = {
                    "source": uri,
                    "key": key,
                    "fetched_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "files": [asdict(r) for r in sorted(records, key=lambda r: r.path)],
                }
                (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
                os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; replicas may run as other users
                final = self.path(key)
                os.rename(tmp, final)
                _fsync_dir(self.root)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return final, False

    @staticmethod
    def _check_complete(tmp: Path, records: list[FileRecord], uri: str) -> None:
        expected = {r.path: r.size_bytes for r in records}
        if MANIFEST_NAME in expected:
            raise SourceIntegrityError(f"{uri}: the source holds a file named {MANIFEST_NAME}, which tideserve reserves")
        found = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in tmp.rglob("*") if p.is_file()}
        for rel, size in expected.items():
            if rel not in found:
                raise SourceIntegrityError(f"{uri}: '{rel}' is missing after the download; retry")
            if found[rel] != size:
                raise SourceIntegrityError(
                    f"{uri}: '{rel}' has {found[rel]} bytes on disk, expected {size}; retry (is the disk full?)"
                )
        extra = sorted(set(found) - set(expected))
        if extra:
            raise SourceIntegrityError(f"{uri}: unexpected files in the download directory: {', '.join(extra[:5])}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
