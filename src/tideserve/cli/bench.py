"""``tideserve bench profile``: measure a pool's engine here and write a service-time profile.

The pool's model is loaded through the worker's own backend (as ``bench/gateway_overhead.py``
drives it) and run on batches of ``batch_size`` windows of ``audio_s`` seconds of real speech
(the clips of the PyPI package pytest-audioeval, joined and looped or trimmed to length), each
point measured ``repeats`` times after one warm-up execution. Output: ``tideserve.sim.profile``.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import statistics
import time
from pathlib import Path
from collections.abc import Callable, Sequence

import numpy as np

from tideserve.cli.engines import backend_version
from tideserve.sim.profile import PoolProfile, Profile, ProfileMetadata, ProfilePoint
from tideserve.spec import InferenceEndpoint

SAMPLE_RATE = 16_000


def speech_samples(speech_dir: Path | None = None) -> np.ndarray:
    """16 kHz mono float32 speech (shape (n,)): every ``*.wav`` (or ``*.npy`` of 16 kHz float32
    samples) of ``speech_dir`` joined, or by default every English clip of pytest-audioeval.
    Raises RuntimeError when there is none."""
    if speech_dir is not None:
        arrays = [np.load(p).astype(np.float32).reshape(-1) for p in sorted(Path(speech_dir).glob("*.npy"))]
        wavs = sorted(Path(speech_dir).glob("*.wav"))
        if wavs:
            from tideserve.worker.audio import decode_audio

            arrays += [decode_audio(p.read_bytes()) for p in wavs]
        if not arrays:
            raise RuntimeError(f"{speech_dir} has no .wav or .npy file; give a directory of speech clips")
        return np.concatenate(arrays)
    try:
        import pytest_audioeval
    except ImportError:
        raise RuntimeError("the speech clips come from the PyPI package pytest-audioeval; install the test "
                           "dependencies (make test) first") from None
    from tideserve.worker.audio import decode_audio

    d = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "en"
    return np.concatenate([decode_audio(p.read_bytes()) for p in sorted(d.glob("*.wav"))])


def clip_of(speech: np.ndarray, audio_s: float, start_s: float = 0.0) -> np.ndarray:
    """``audio_s`` seconds of ``speech`` from ``start_s`` on, looping past its end."""
    n = round(audio_s * SAMPLE_RATE)
    start = int(start_s * SAMPLE_RATE) % len(speech)
    reps = (start + n) // len(speech) + 1
    return np.tile(speech, reps)[start:start + n].astype(np.float32)


def _gpu_name() -> str | None:
    from tideserve.nvml import gpu_names

    names = gpu_names()
    return names[0] if names else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def measure_profile(ep: InferenceEndpoint, pools: Sequence[str], batch_sizes: Sequence[int],
                    audio_lengths_s: Sequence[float], repeats: int,
                    progress: Callable[[str], None] = lambda s: None, speech_dir: Path | None = None,
                    allowed_file_roots: Sequence[Path] = (), cache_dir: Path | None = None) -> Profile:
    """Measure each named pool of ``ep`` (its target, on this machine) and return the profile.
    ``allowed_file_roots`` and ``cache_dir`` (the local config's) apply to the model source.

    Raises KeyError for an unknown pool, EngineMismatchError when the target does not run here,
    SourceError when the model cannot be fetched.
    """
    from tideserve.sources import resolve_source
    from tideserve.worker.backends import WindowTask, backend_class

    spec = ep.spec
    load_before = os.getloadavg()[0]
    speech = speech_samples(speech_dir)
    model_dir = resolve_source(spec.model.source, list(allowed_file_roots), cache_dir)
    out = []
    for name in pools:
        pool = spec.pool(name)
        backend = backend_class(spec.model.backend)(model_dir, pool.parsed_target, spec.model.decoding,
                                                    max_batch_size=max(batch_sizes))
        backend.transcribe_batch([WindowTask(clip_of(speech, 5.0))])  # warm-up
        points = []
        for audio_s in audio_lengths_s:
            for bs in batch_sizes:
                tasks = [WindowTask(clip_of(speech, audio_s, 1.7 * k)) for k in range(bs)]
                samples = []
                for _ in range(repeats):
                    t = time.perf_counter()
                    backend.transcribe_batch(tasks)
                    samples.append(time.perf_counter() - t)
                points.append(ProfilePoint(batch_size=bs, audio_s=audio_s, latency_s=statistics.median(samples),
                                           samples_s=[round(s, 4) for s in samples]))
                progress(f"{name} ({pool.target}): batch {bs} x {audio_s:g} s -> {points[-1].latency_s:.3f} s")
        out.append(PoolProfile(pool=name, target=pool.target, accelerator=pool.accelerator, points=points))
        del backend
    version = backend_version(spec.model.backend)
    meta = ProfileMetadata(
        machine=socket.gethostname(), cpu=_cpu_model(), cpus=os.cpu_count() or 0, gpu=_gpu_name(),
        date=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(), model=spec.model.name,
        model_source=spec.model.source, backend=spec.model.backend, backend_version=version,
        decoding=spec.model.decoding.model_dump(), repeats=repeats, measured=True,
        load_average_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        notes=f"one execution of the worker's {spec.model.backend} backend (features, batched encoder, batched "
              f"{'greedy decoding' if spec.model.decoding.beam_size == 1 else 'beam search'}) on speech looped to "
              "length; no HTTP, no audio decoding",
    )
    return Profile(metadata=meta, pools=out)
