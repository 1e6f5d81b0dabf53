"""Model backends, keyed by the spec's ``model.backend`` field.

Each backend module is the only importer of its library; modules are imported lazily so
that a worker loads only the library it serves with.
"""

from __future__ import annotations

import importlib

from tideserve.worker.backends.base import Backend, WindowResult, WindowTask

#: spec ``model.backend`` -> "module:class"
BACKENDS: dict[str, str] = {
    "faster-whisper": "tideserve.worker.backends.faster_whisper:FasterWhisperBackend",
    "torch": "tideserve.worker.backends.torch_whisper.backend:TorchWhisperBackend",
}


def backend_class(name: str) -> type:
    """The backend class registered under ``name``. Raises KeyError listing the known names."""
    try:
        module, cls = BACKENDS[name].split(":")
    except KeyError:
        raise KeyError(f"unknown backend '{name}'; known: {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module), cls)


__all__ = ["BACKENDS", "Backend", "WindowResult", "WindowTask", "backend_class"]
