"""Engines: a model prepared for one target, stored with a manifest in the local cache.

Layout: ``<cache_dir>/engines/<model key>/<target>/`` holds the model files and
``engine.json`` (the manifest: model key and sha256 digest, source, backend and its version,
target, compute type, CPU flags it needs, build time, files with sizes and sha256). The model
key is a digest of the model directory's listing (relative paths, sizes, modification times),
cheap to compute at every start; the full content digest is computed once, at build.

For CTranslate2 (the faster-whisper backend) a CPU engine is the converted model plus the
manifest that pins its target: CTranslate2 dispatches CPU kernels at run time and applies the
compute type when it loads (its docs: "quantization on model loading"), so there is no
per-ISA compilation to do; the manifest is what makes a replica refuse an engine built for
another target. Backends that compile per architecture (CUDA) write their artefacts here too.
Engines are published atomically: built in a temporary directory, renamed into place.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable

from tideserve.engines.compat import DeviceInfo, check_target
from tideserve.errors import EngineMismatchError
from tideserve.spec.models import Target

MANIFEST = "engine.json"


@dataclass(frozen=True)
class EngineManifest:
    model_key: str
    model_sha256: str
    source: str
    backend: str
    backend_version: str
    target: str
    compute_type: str
    required_cpu_flags: list[str] = field(default_factory=list)
    built_at: str = ""
    files: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def read(cls, engine_dir: Path) -> EngineManifest:
        """Raises EngineMismatchError when the manifest is missing or unreadable."""
        path = Path(engine_dir) / MANIFEST
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise EngineMismatchError(
            f"{path}: not a readable engine manifest ({exc}); rebuild it with `tideserve build FILE --force`") from None


def _files(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.rglob("*") if p.is_file() and p.name != MANIFEST)


def model_key(model_dir: Path) -> str:
    """Digest of the model directory's listing (relative path, size, mtime in ns): it changes
    whenever a file does, without reading the files."""
    h = hashlib.sha256()
    for p in _files(model_dir):
        st = p.stat()
        h.update(f"{p.relative_to(model_dir)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def engine_dir(cache_dir: Path, key: str, target: str) -> Path:
    return Path(cache_dir) / "engines" / key / target


def find_engine(cache_dir: Path, model_dir: Path, target: str) -> Path | None:
    """The engine directory for this model and target, if one was built."""
    d = engine_dir(cache_dir, model_key(model_dir), target)
    return d if (d / MANIFEST).is_file() else None


def cpu_flags_needed(target: Target) -> list[str]:
    """CPU flags an engine for ``target`` needs. CTranslate2 selects its CPU kernels at run
    time, so its engines need none beyond the ISA; kept in the manifest for backends that do."""
    return []


def build_engine(
    cache_dir: Path,
    model_dir: Path,
    source: str,
    target: Target,
    backend: str,
    backend_version: str,
    verify: Callable[[Path], None] | None = None,
    force: bool = False,
    convert: Callable[[Path, Path], None] | None = None,
) -> Path:
    """Build (or return the existing) engine of ``model_dir`` for ``target``.

    Files are copied into the engine directory, or, when ``convert`` is given, written there by
    ``convert(model_dir, engine_dir)`` (e.g. a CTranslate2 model turned into the torch backend's
    format); ``verify(engine_dir)`` may load it to prove it works before it is published. An
    existing engine is returned unless ``force`` is set or its files no longer match its manifest
    (then it is rebuilt). Returns the engine directory.
    Raises whatever ``verify`` raises, publishing nothing.
    """
    model_dir = Path(model_dir)
    key = model_key(model_dir)
    final = engine_dir(cache_dir, key, target.name)
    had_manifest = (final / MANIFEST).is_file()
    existing_damage = _damaged(final) if had_manifest else "no manifest"
    if not force and existing_damage is None:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        if convert is not None:
            convert(model_dir, tmp)
        else:
            for p in _files(model_dir):
                dst = tmp / p.relative_to(model_dir)
                dst.parent.mkdir(parents=True, exist_ok=True)
                # A copy, not a hard link: an engine file changed in place must not change the
                # source model (or the package that ships it) too.
                shutil.copy2(p, dst)
        files = {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in _files(tmp)}
        digest = hashlib.sha256("".join(f"{k}:{v['sha256']}\n" for k, v in sorted(files.items())).encode()).hexdigest()
        manifest = EngineManifest(
            model_key=key, model_sha256=digest, source=source, backend=backend, backend_version=backend_version,
            target=target.name, compute_type=target.backend_compute_type,
            required_cpu_flags=cpu_flags_needed(target),
            built_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), files=files,
        )
        (tmp / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2))
        if verify is not None:
            verify(tmp)
        if final.exists() and not had_manifest and (final / MANIFEST).is_file():
            existing_damage = _damaged(final)  # published by another builder meanwhile: check theirs
        if final.exists() and (force or existing_damage is not None):
            stale = final.with_name(f".stale-{final.name}-{os.getpid()}")
            os.rename(final, stale)  # out of the way first, so the new engine lands atomically
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MANIFEST).is_file():  # another builder won the race: keep theirs
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _damaged(engine: Path, m: EngineManifest | None = None) -> str | None:
    """What is wrong with an engine's files compared with its manifest ``m`` (read from the
    engine when not given): a missing file, a size that differs; None when intact."""
    if m is None:
        try:
            m = EngineManifest.read(engine)
        except EngineMismatchError as exc:
            return str(exc)
    for name, info in m.files.items():
        p = engine / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != info.get("size"):
            return f"{name} is {p.stat().st_size} bytes, the manifest says {info.get('size')}"
    return None


def check_engine(engine: Path, expected_target: str, device: DeviceInfo) -> EngineManifest:
    """The engine's manifest, after checking it is the pool's target and runs on ``device``.

    Raises EngineMismatchError naming both sides: a manifest for another target than the
    pool's, another CPU ISA or CUDA architecture than this machine's, or CPU flags missing.
    """
    m = EngineManifest.read(engine)
    damage = _damaged(engine, m)
    if damage:
        raise EngineMismatchError(
            f"engine {engine} is damaged ({damage}); rebuild it with `tideserve build FILE --target {m.target}` "
            "(a damaged engine is rebuilt)"
        )
    if m.target != expected_target:
        raise EngineMismatchError(
            f"engine {engine} was built for {m.target}, but the pool's target is {expected_target}; "
            f"rebuild it with `tideserve build FILE --target {expected_target} --force`"
        )
    check_target(Target.parse(m.target), device)
    missing = sorted(set(m.required_cpu_flags) - set(device.cpu_flags))
    if missing:
        raise EngineMismatchError(
            f"engine {engine} ({m.target}) needs CPU flags {', '.join(missing)}, which this machine lacks"
        )
    return m
