from __future__ import annotations

import numpy as np
import pytest
from conftest import SR, encode

from tideserve.errors import BadInputError
from tideserve.worker.audio import decode_audio


@pytest.fixture(scope="module")
def tone() -> np.ndarray:
    t = np.arange(int(2.5 * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "ogg", "webm"])
@pytest.mark.parametrize("rate,channels", [(8000, 1), (44100, 2), (48000, 2)])
def test_formats_rates_and_channels_become_16k_mono(tone, fmt, rate, channels):
    data = encode(tone, fmt, rate=rate, channels=channels)
    samples = decode_audio(data)
    assert samples.dtype == np.float32 and samples.ndim == 1
    # Codec padding (mp3, opus) adds at most ~60 ms; the length says 16 kHz whatever the input rate.
    assert abs(len(samples) / SR - 2.5) < 0.08, len(samples) / SR
    # The 440 Hz tone survives resampling: its spectral peak is where it was.
    spec = np.abs(np.fft.rfft(samples[SR // 2: SR // 2 + SR]))
    assert abs(np.argmax(spec) - 440) <= 2


def test_stereo_is_mixed_not_left_channel_only():
    import av, io

    n = SR
    left = np.zeros(n, np.float32)
    right = (0.5 * np.sin(2 * np.pi * 300 * np.arange(n) / SR)).astype(np.float32)
    buf = io.BytesIO()
    with av.open(buf, "w", format="wav") as out:
        st = out.add_stream("pcm_s16le", rate=SR, layout="stereo")
        frame = av.AudioFrame.from_ndarray(np.stack([left, right]).astype(np.float32), format="fltp", layout="stereo")
        frame.sample_rate = SR
        for f in av.AudioResampler(format="s16", layout="stereo", rate=SR).resample(frame):
            for p in st.encode(f):
                out.mux(p)
        for p in st.encode(None):
            out.mux(p)
    mono = decode_audio(buf.getvalue())
    assert np.abs(mono).max() > 0.1  # the right channel's tone is in the mix


def test_empty_bytes():
    with pytest.raises(BadInputError, match="audio is empty"):
        decode_audio(b"")


def test_not_audio():
    with pytest.raises(BadInputError, match="could not decode the audio"):
        decode_audio(b"%PDF-1.4 definitely not audio" * 100)


def test_truncated_wav(tone):
    wav = encode(tone, "wav")
    with pytest.raises(BadInputError, match=r"truncated WAV: its data chunk declares \d+ bytes but only \d+ are present"):
        decode_audio(wav[: len(wav) - 1000])
    with pytest.raises(BadInputError, match="ends before its 'data' chunk"):
        decode_audio(wav[:30])


def test_wav_with_no_samples():
    import struct

    fmt = struct.pack("<HHIIHH", 1, 1, SR, SR * 2, 2, 16)
    wav = b"RIFF" + struct.pack("<I", 36) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", 0)
    with pytest.raises(BadInputError, match="no samples|could not decode"):
        decode_audio(wav)
