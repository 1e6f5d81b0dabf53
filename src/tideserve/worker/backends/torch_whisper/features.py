"""Whisper's log-mel features in PyTorch (on the model's device), matching faster-whisper's
feature extractor so both backends see the same input.

Per window: 16 kHz samples, 160 zero samples appended, STFT (n_fft 400, hop 160, periodic Hann
window, reflect padding), power spectrum without the last frame, a Slaney-style mel filter
bank (``n_mels`` bands, 0 to 8 kHz, area-normalised), log10 clamped at 1e-10, floored at the
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


def _hz_to_mel(f: np.ndarray | float) -> np.ndarray:
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
    """Log-mel features for windows of audio, computed on ``device`` as one batched operation."""

    def __init__(self, n_mels: int, device: torch.device) -> None:
        self.device = device
        self.filters = torch.from_numpy(mel_filters(n_mels)).to(device)
        self.window = torch.hann_window(N_FFT, periodic=True, device=device)
        # Page-locked host buffers, each with the event after its last asynchronous copy to the
        # device (None before any): a call takes one whose copy is done, or a new one (up to
        # RING), and waits only when all are in use. Why several: with the torch backend's
        # overlap_encoder the copies are queued on the encoder's stream, possibly behind a
        # pass still running, and waiting for that would stop the engine thread (a review,
        # 2026-12-07); with one stream the first buffer is nearly always free (the engine loop
        # waits for the device once per decode chunk). No host-device synchronisation otherwise.
        self._ring: list[list] = []

    RING = 4

    def _host_buffer(self, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, list]:
        """A 1-D host buffer of at least ``n`` samples whose last copy to the device is done,
        page-locked when the device is a GPU (so the copy is one DMA transfer), and its ring
        entry (``[buffer, event]``), moved to the ring's end (the most recently used)."""
        k = next((i for i, e in enumerate(self._ring) if e[1] is None or e[1].query()), None)
        if k is None and len(self._ring) >= self.RING:
            k = 0  # the least recently used: wait for its copy
            self._ring[0][1].synchronize()
        free = [None, None] if k is None else self._ring.pop(k)
        self._ring.append(free)
        buf = free[0]
        if buf is None or buf.dtype != dtype or buf.shape[0] < n:
            size = max(n, 2 * (0 if buf is None else buf.shape[0]))
            buf = torch.empty(size, dtype=dtype, pin_memory=self.device.type == "cuda")
            free[0] = buf
        return buf[:n], free

    def __call__(self, windows: list[np.ndarray]) -> torch.Tensor:
        """``windows`` of samples (each <= 30 s; int16 PCM or float32 in [-1, 1]) ->
        ``[B, n_mels, 3000]`` float32.

        The windows' samples are packed end to end into one host buffer (only the audio, no
        padding), copied to the device at once, laid out in zero-padded rows there, and
        transformed together (one STFT, one mel product). Each row equals the per-window
        computation: the zeros after a window's end are exactly the zeros and reflected zeros
        the per-window STFT sees in the frames kept (the last two frames are dropped, see the
        module doc), and each row's floor (max - 8) is taken over its own frames only.
        """
        n = len(windows)
        lengths = [len(w) for w in windows]
        # Per window: samples + HOP zeros (at least N_FFT // 2 + 1 in all, for the reflect padding).
        padded = [max(length + HOP, N_FFT // 2 + 1) for length in lengths]
        total = max(max(padded), N_FRAMES * HOP + HOP)
        int16 = all(w.dtype == np.int16 for w in windows)
        flat, entry = self._host_buffer(max(1, sum(lengths)), torch.int16 if int16 else torch.float32)
        if sum(lengths):
            np.concatenate([w if int16 else w.astype(np.float32, copy=False) for w in windows],
                           out=flat.numpy()[: sum(lengths)])
        cuda = self.device.type == "cuda"
        dev = flat.to(self.device, non_blocking=cuda).float()
        if cuda:
            entry[1] = torch.cuda.Event()
            entry[1].record()
        if int16:
            dev = dev / 32768.0
        x = torch.zeros(n, total, device=self.device)
        offset = 0
        for i, length in enumerate(lengths):
            x[i, :length] = dev[offset: offset + length]
            offset += length
        spec = torch.stft(x, N_FFT, HOP, window=self.window, center=True, pad_mode="reflect", return_complex=True)
        power = spec[..., :-1].abs() ** 2  # [B, 201, frames]
        logmel = torch.clamp(self.filters @ power, min=1e-10).log10()  # [B, n_mels, frames]
        # frames before the 2nd drop; from pageable memory without a device synchronisation
        frames = torch.tensor([p // HOP for p in padded]).to(self.device, non_blocking=True)
        valid = torch.arange(logmel.shape[-1], device=self.device)[None, :] < frames[:, None]
        peak = logmel.masked_fill(~valid[:, None, :], float("-inf")).amax(dim=(1, 2), keepdim=True)
        logmel = (torch.maximum(logmel, peak - 8.0) + 4.0) / 4.0
        # faster-whisper drops one more frame before padding to 3000 (``pad_or_trim(fe(x)[..., :-1])``).
        keep = torch.arange(logmel.shape[-1], device=self.device)[None, :] < (frames - 1)[:, None]
        logmel = logmel.masked_fill(~keep[:, None, :], 0.0)
        out = torch.zeros(n, self.filters.shape[0], N_FRAMES, device=self.device)
        width = min(N_FRAMES, logmel.shape[-1])
        out[:, :, :width] = logmel[:, :, :width]
        return out
