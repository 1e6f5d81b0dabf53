"""Decode one window of a file through the worker's engine loop (``worker.engine.EngineLoop``)
over a real backend, as the worker does, for tests that need Whisper's long-form rules on the
real model (tests/unit/worker/test_quiet_tail.py, test_resumed_rest.py)."""

from __future__ import annotations

import threading
from dataclasses import fields

import numpy as np

from tideserve.spec.models import Decoding
from tideserve.worker.engine import EngineLoop, EngineStats, RequestOptions


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
