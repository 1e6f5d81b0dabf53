"""Optional extras: which feature needs which ``pip install 'tideserve[EXTRA]'``.

The default install serves the default endpoint (faster-whisper on the CPU, ``pkg://`` and
``file://`` model sources). Heavier libraries come with extras, named in pyproject.toml
``[project.optional-dependencies]``; :data:`EXTRAS` mirrors it (tests/unit/project checks they
agree). Code that needs an extra imports its adapter inside :func:`needs_extra`, which turns the
``ModuleNotFoundError`` of a missing library into a :class:`MissingExtraError` naming the extra.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

from tideserve.errors import MissingExtraError

#: extra -> top-level import names of the libraries it installs
EXTRAS: dict[str, tuple[str, ...]] = {
    "s3": ("boto3", "botocore"),
    "hf": ("huggingface_hub",),
    "k8s": ("kopf", "kubernetes"),
    "sim": ("matplotlib",),
    "gpu": ("torch", "safetensors", "pynvml"),
}


def _missing(extra: str, feature: str, library: str) -> MissingExtraError:
    return MissingExtraError(f"{feature} need the '{extra}' extra ({library} is not installed); install it "
                             f"with pip install 'tideserve[{extra}]' (or 'tideserve[all]')", extra=extra)


@contextmanager
def needs_extra(extra: str, feature: str) -> Iterator[None]:
    """Run the body (an import of the adapter of ``extra``); if one of the extra's libraries is
    missing, raise :class:`MissingExtraError` saying that ``feature`` (e.g. "s3:// model
    sources") needs ``pip install 'tideserve[EXTRA]'``. Other import errors pass unchanged.
    Raises KeyError for an ``extra`` not in :data:`EXTRAS` (a programming error)."""
    libraries = EXTRAS[extra]
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in libraries:
            raise
        raise _missing(extra, feature, exc.name or "") from exc


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtraError` now if a library of ``extra`` is not installed, before
    work whose end needs it (e.g. a simulation whose report is plotted) is started. Finds the
    modules without importing them."""
    for name in EXTRAS[extra]:
        if importlib.util.find_spec(name) is None:
            raise _missing(extra, feature, name)
