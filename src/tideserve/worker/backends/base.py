"""The contract between the worker and a model backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tideserve.protocol.types import Segment
from tideserve.worker.batcher import ExecutionTimings


@dataclass(frozen=True)
class WindowTask:
    """One window (<= 30 s) of one request: 16 kHz mono float32 ``samples`` starting at
    ``offset_s`` in the file, with that request's prompt, language and timestamp wish."""

    samples: np.ndarray
    offset_s: float = 0.0
    prompt: str | None = None
    language: str | None = None
    timestamps: bool = False


@dataclass
class WindowResult:
    """The decoded text of one window; segment times are absolute (offset added)."""

    text: str
    language: str
    segments: list[Segment] = field(default_factory=list)
    #: Seconds from the window's start where decoding stopped short, leaving the rest of the
    #: window untranscribed for a next window (Whisper's seek); None when the window is done.
    unfinished_from_s: float | None = None


class Backend(Protocol):
    """A loaded model. ``transcribe_batch`` runs all tasks as ONE model execution.

    Constructed as ``cls(model_dir, target, decoding, cpu_threads=…, max_batch_size=…)``; a
    backend that preallocates per batch (the torch backend's KV cache) sizes itself by
    ``max_batch_size`` (the endpoint's ``batching.max_batch_size``)."""

    #: Language codes the model can transcribe (e.g. {"en"} for an English-only model).
    languages: frozenset[str]

    def transcribe_batch(self, tasks: list[WindowTask]) -> tuple[list[WindowResult], ExecutionTimings]: ...
