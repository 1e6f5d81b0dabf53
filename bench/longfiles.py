"""Long test files built from short clips (numpy only, so the GPU machine can rebuild them from
the clips and a seed instead of carrying minutes of audio): bench/accuracy.py, bench/cut_rule_ab.py
and bench/accuracy_gpu.py use the same files."""

from __future__ import annotations

import io
import wave
from typing import Protocol
from collections.abc import Sequence

import numpy as np

SR = 16_000


class ClipLike(Protocol):
    samples: np.ndarray  # float32, 16 kHz mono
    reference: str


def long_file(clips: Sequence[ClipLike], minutes: float, seed: int) -> tuple[np.ndarray, str]:
    """Clips in a seeded random order (never the same one twice in a row) with 0.4-1.6 s gaps of
    low noise (peak -60 to -54 dBFS), at least ``minutes`` long. Returns (float32 samples, the
    reference text: the clips' references in order)."""
    samples, ref, _ = spaced_file(clips, minutes, seed)
    return samples, ref


def long_files(clips: Sequence[ClipLike], minutes: Sequence[float], seeds: Sequence[int] = ()
               ) -> list[tuple[str, np.ndarray, str]]:
    """bench/accuracy.py's long files as ``(name, float32 samples, reference)``: one per
    ``minutes`` value with seeds 13, 14, ... (named ``long-{m}min``), or with ``seeds`` one per
    seed, paired with the ``minutes`` values or all of the one value given (``long-{m}min-seed{s}``).
    Raises ValueError when there are several ``minutes`` values and not as many seeds."""
    if seeds and len(minutes) == 1:
        minutes = list(minutes) * len(seeds)  # one file of that length per seed
    elif seeds and len(minutes) != len(seeds):
        raise ValueError("--seeds: one per --minutes value, or any number with one --minutes value")
    out = []
    for i, m in enumerate(minutes):
        s, ref = long_file(clips, m, seed=seeds[i] if seeds else 13 + i)
        out.append((f"long-{m:g}min-seed{seeds[i]}" if seeds else f"long-{m:g}min", s, ref))
    return out


def spaced_file(clips: Sequence[ClipLike], minutes: float, seed: int, gap_s: tuple[float, float] = (0.4, 1.6),
                digital: bool = False) -> tuple[np.ndarray, str, list[tuple[float, float]]]:
    """``long_file`` with gaps of ``gap_s`` seconds (uniform), of digital zeros when ``digital``;
    also returns each clip's ``(start_s, end_s)`` in the file. With the defaults, the same file
    as ``long_file`` for the same seed."""
    rng = np.random.default_rng(seed)
    parts, refs, spans, total, last = [], [], [], 0, -1
    while total < minutes * 60 * SR:
        choices = [i for i in range(len(clips)) if i != last]
        last = choices[int(rng.integers(len(choices)))]
        c = clips[last]
        gap = rng.normal(0, 1, int(rng.uniform(*gap_s) * SR)).astype(np.float32)
        gap *= 10 ** (-60 / 20) / max(1e-9, float(np.abs(gap).max())) * rng.uniform(1, 2) * (0.0 if digital else 1.0)
        parts += [c.samples, gap]
        refs.append(c.reference)
        spans.append((total / SR, (total + len(c.samples)) / SR))
        total += len(c.samples) + len(gap)
    return np.concatenate(parts), " ".join(refs), spans


def wav_pcm16(samples: np.ndarray, rate: int = SR) -> bytes:
    """Mono PCM16 WAV bytes of ``samples``: int16 as they are, float in [-1, 1] scaled to int16."""
    if samples.dtype != np.int16:
        samples = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return buf.getvalue()
