"""Model backends, keyed by the spec's ``model.backend`` field.

Each backend module is the only importer of its library; modules are imported lazily so
that a worker loads only the library it serves with.
"""

from __future__ import annotations

import importlib

from tideserve.extras import needs_extra

from tideserve.worker.backends.base import Backend, WindowResult, WindowTask

#: spec ``model.backend`` -> "module:class"
BACKENDS: dict[str, str] = {
    "faster-whisper": "tideserve.worker.backends.faster_whisper:FasterWhisperBackend",
    "torch": "tideserve.worker.backends.torch_whisper.backend:TorchWhisperBackend",
}
#: backends whose library comes with an optional extra (tideserve.extras); the default install
#: has faster-whisper
BACKEND_EXTRAS: dict[str, str] = {"torch": "gpu"}


def backend_class(name: str) -> type:
    """The backend class registered under ``name``. Raises KeyError listing the known names,
    MissingExtraError when the backend's library (an optional extra) is not installed."""
    try:
        module, cls = BACKENDS[name].split(":")
    except KeyError:
        raise KeyError(f"unknown backend '{name}'; known: {', '.join(BACKENDS)}") from None
    if name not in BACKEND_EXTRAS:
        return getattr(importlib.import_module(module), cls)
    with needs_extra(BACKEND_EXTRAS[name], f"model.backend '{name}' workers"):
        return getattr(importlib.import_module(module), cls)


__all__ = ["BACKENDS", "Backend", "WindowResult", "WindowTask", "backend_class"]
