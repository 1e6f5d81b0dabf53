"""Whisper's log-mel features in PyTorch (on the model's device), matching faster-whisper's
feature extractor so both backends see the same input.

Per window: 16 kHz samples, 160 zero samples appended, STFT (n_fft 400, hop 160, periodic Hann
window, reflect padding), power spectrum without the last frame, a Slaney-style mel filter
bank (``n_mels`` bands, 0–8 kHz, area-normalised), log10 clamped at 1e-10, floored at the
window's maximum minus 8, scaled ``(x + 4) / 4``; then zero-padded (or cut) to 3000 frames.
Source: Whisper's ``log_mel_spectrogram`` (Radford et al. 2022) and faster-whisper's
``FeatureExtractor`` (which pads by 160 samples and normalises before padding to 30 s).
"""

from __future__ import annotations

import math

import numpy as np
import torch

SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160
N_FRAMES = 3000  # 30 s


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (3 bands per 200 Hz) below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    lin = f / (200.0 / 3)
    log = 15.0 + np.log(np.maximum(f, 1e-12) / 1000.0) / (math.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log, lin)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((m - 15.0) * (math.log(6.4) / 27.0)), m * (200.0 / 3))


def mel_filters(n_mels: int, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """Triangular mel filters ``[n_mels, n_fft // 2 + 1]`` (float32), each scaled by
    2 / (its bandwidth in Hz) (Slaney normalisation, as librosa's default Whisper uses)."""
    fft_hz = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(sample_rate / 2), n_mels + 2))
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (fft_hz[None, :] - lo) / (mid - lo)
    down = (hi - fft_hz[None, :]) / (hi - mid)
    tri = np.maximum(0.0, np.minimum(up, down))
    return (tri * (2.0 / (hi - lo))).astype(np.float32)


class LogMel:
    """Log-mel features for windows of audio, computed on ``device``."""

    def __init__(self, n_mels: int, device: torch.device) -> None:
        self.device = device
        self.filters = torch.from_numpy(mel_filters(n_mels)).to(device)
        self.window = torch.hann_window(N_FFT, periodic=True, device=device)

    def __call__(self, windows: list[np.ndarray]) -> torch.Tensor:
        """``windows`` of float32 samples (each <= 30 s) -> ``[B, n_mels, 3000]`` float32."""
        out = torch.zeros(len(windows), self.filters.shape[0], N_FRAMES, device=self.device)
        for i, samples in enumerate(windows):
            x = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)).to(self.device)
            # The reflect padding of a centred STFT needs more than N_FFT // 2 samples: a clip of
            # a few samples (e.g. one) is zero-extended to that length, as silence would be.
            x = torch.nn.functional.pad(x, (0, max(HOP, N_FFT // 2 + 1 - x.shape[0])))
            spec = torch.stft(x, N_FFT, HOP, window=self.window, center=True, pad_mode="reflect", return_complex=True)
            power = spec[:, :-1].abs() ** 2
            logmel = torch.clamp(self.filters @ power, min=1e-10).log10()
            logmel = torch.maximum(logmel, logmel.max() - 8.0)
            logmel = (logmel + 4.0) / 4.0
            # faster-whisper's backend drops one more frame before padding to 3000 (see its
            # ``pad_or_trim(fe(samples)[..., :-1])``); do the same so both backends agree.
            logmel = logmel[:, :-1][:, :N_FRAMES]
            out[i, :, : logmel.shape[1]] = logmel
        return out
