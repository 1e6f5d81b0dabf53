"""Split audio longer than Whisper's 30 s input window into windows at quiet points.

Whisper's encoder takes a fixed 30 s window (3000 mel frames; ../shared/FACTS.md). Longer
audio is cut into windows of at most 30 s; each cut is placed at the quietest 100 ms frame
(lowest RMS energy) in the last ``search_s`` seconds before the 30 s limit, so a cut rarely
splits a word. The windows of one file are then decoded in parallel, in one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WINDOW_S = 30.0


@dataclass(frozen=True)
class Window:
    """A slice of a file's samples: ``samples`` (16 kHz mono float32) start at ``offset_s``."""

    samples: np.ndarray
    offset_s: float


def split_windows(
    samples: np.ndarray, sample_rate: int = 16_000, window_s: float = WINDOW_S, search_s: float = 5.0
) -> list[Window]:
    """Cut ``samples`` (shape (n,), int16 PCM or float) into windows of at most ``window_s`` seconds.

    Returns at least one window; windows cover the input exactly, in order, without overlap.
    """
    limit = int(window_s * sample_rate)
    frame = max(1, sample_rate // 10)  # 100 ms frames for the energy search
    out: list[Window] = []
    start, n = 0, len(samples)
    while n - start > limit:
        lo = start + limit - int(search_s * sample_rate)
        region = samples[lo : start + limit].astype(np.float32)  # int16 PCM squared would overflow
        nframes = len(region) // frame
        energy = np.sqrt(np.mean(region[: nframes * frame].reshape(nframes, frame) ** 2, axis=1))
        # Cut in the middle of the quietest frame; ties go to the latest frame (longer window).
        best = nframes - 1 - int(np.argmin(energy[::-1]))
        cut = lo + best * frame + frame // 2
        out.append(Window(samples[start:cut], start / sample_rate))
        start = cut
    out.append(Window(samples[start:], start / sample_rate))
    return out
