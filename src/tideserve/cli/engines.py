"""Engine preparation, composed from sources (fetch), engines (build, check) and, for
``tideserve build``, the worker's backend (a test load)."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import subprocess
import sys
from pathlib import Path

from tideserve.engines import build_engine, check_engine, check_target, find_engine, probe_device
from tideserve.errors import EngineMismatchError
from tideserve.sources import resolve_source
from tideserve.spec import InferenceEndpoint, LocalConfig, Pool, Target
from tideserve.spec.models import Decoding

log = logging.getLogger("tideserve.engines")

#: The library whose version an engine of each backend records.
BACKEND_LIBRARY = {"faster-whisper": "ctranslate2", "torch": "torch"}


def engine_converter(backend: str, model_dir: Path):
    """How a model directory becomes a ``backend`` engine: None to copy it as is, or a
    ``convert(src, dst)``. The torch backend reads Hugging Face-format directories; a
    CTranslate2 model (``model.bin``, as the bundled model is) is converted on the way."""
    if backend == "torch" and (Path(model_dir) / "model.bin").is_file():
        from tideserve.engines.convert import convert_ct2_whisper

        return lambda src, dst: convert_ct2_whisper(src, dst, dtype="float16")
    return None


def backend_version(backend: str) -> str:
    lib = BACKEND_LIBRARY.get(backend, backend)
    try:
        return f"{lib} {importlib.metadata.version(lib)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{lib} (not installed)"


def _warm_page_cache(engine: Path) -> None:
    """Ask the kernel to read the engine's files ahead (POSIX_FADV_WILLNEED), so the first
    replica's model load reads from memory."""
    if not hasattr(os, "posix_fadvise"):
        return
    for p in engine.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)


def prepare_engine(endpoint: InferenceEndpoint, pool: Pool, cfg: LocalConfig, build_missing: bool = True) -> Path:
    """The pool's engine directory, ready to load here. Fetches the model source, builds the
    engine if it is missing (unless ``build_missing`` is false) and loads it once before
    publishing it, as ``tideserve build`` does (so a corrupt or truncated model is found here,
    not by replicas that crash one after the other), checks it against this device. Raises
    EngineMismatchError / SourceError when the pool cannot run here (EngineMismatchError also
    when the model does not load)."""
    target = pool.parsed_target
    device = probe_device()
    check_target(target, device)
    model_dir = resolve_source(endpoint.spec.model.source, cfg.allowed_file_roots, cfg.cache_dir)
    engine = find_engine(cfg.cache_dir, model_dir, target.name)
    if engine is None:
        if not build_missing:
            raise EngineMismatchError(
                f"no engine of {endpoint.spec.model.source} for target {target.name}; "
                f"build it with `tideserve build FILE --target {target.name}`"
            )
        backend = endpoint.spec.model.backend
        engine = build_engine(cfg.cache_dir, model_dir, endpoint.spec.model.source, target, backend,
                              backend_version(backend), convert=engine_converter(backend, model_dir),
                              verify=lambda d: load_in_child(d, backend, target, endpoint.spec.model.decoding,
                                                             endpoint.spec.model.source))
        log.info("engine built", extra={"pool": pool.name, "target": target.name, "engine": str(engine)})
    check_engine(engine, target.name, device)
    _warm_page_cache(engine)
    return engine


def build(endpoint: InferenceEndpoint, target: Target, cfg: LocalConfig, verify: bool = True, force: bool = False) -> Path:
    """``tideserve build``: the engine of the endpoint's model for ``target``. When the target
    runs on this machine and ``verify`` is set, the engine is loaded once before it is published."""
    spec = endpoint.spec
    model_dir = resolve_source(spec.model.source, cfg.allowed_file_roots, cfg.cache_dir)
    runs_here = True
    try:
        check_target(target, probe_device())
    except EngineMismatchError:
        runs_here = False
    if target.device == "cuda" and spec.model.backend == "faster-whisper":
        raise EngineMismatchError(
            f"the {spec.model.backend} backend builds CPU engines here (CTranslate2's CUDA build needs libcublas 12); "
            f"{target.name} needs a CUDA backend"
        )

    def load(engine_dir: Path) -> None:
        from tideserve.worker.backends import backend_class

        backend_class(spec.model.backend)(engine_dir, target, spec.model.decoding)

    return build_engine(cfg.cache_dir, model_dir, spec.model.source, target, spec.model.backend,
                        backend_version(spec.model.backend), verify=load if (verify and runs_here) else None,
                        force=force, convert=engine_converter(spec.model.backend, model_dir))


#: Longest a test load of a freshly built engine may take (large models on a slow disk).
LOAD_CHECK_TIMEOUT_S = 600.0


def load_in_child(engine_dir: Path, backend: str, target: Target, decoding: Decoding, source: str,
                  timeout_s: float = LOAD_CHECK_TIMEOUT_S) -> None:
    """Load ``engine_dir`` once with ``backend`` in a child process (the serving process must
    not keep the model's memory, nor a CUDA context). Raises EngineMismatchError with the
    loader's last error line when it fails or takes more than ``timeout_s`` seconds."""
    cmd = [sys.executable, "-m", "tideserve.cli.engines", str(engine_dir), backend, target.name,
           decoding.model_dump_json()]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise EngineMismatchError(f"the {backend} engine of {source} for {target.name} did not load within "
                                  f"{timeout_s:g} s") from None
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr or "").splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit code {done.returncode}"
        raise EngineMismatchError(
            f"the model {source} does not load with the {backend} backend ({why}); its files are damaged, truncated "
            f"or not a {backend} model: fix the source, then start again (or `tideserve build FILE --target "
            f"{target.name} --force`)")


def _load_main(argv: list[str]) -> int:
    """``python -m tideserve.cli.engines ENGINE_DIR BACKEND TARGET DECODING_JSON``: load once."""
    engine_dir, backend, target, decoding = argv
    from tideserve.worker.backends import backend_class

    try:
        backend_class(backend)(Path(engine_dir), Target.parse(target), Decoding.model_validate_json(decoding))
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_load_main(sys.argv[1:]))
