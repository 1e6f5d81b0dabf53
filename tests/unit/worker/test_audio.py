from __future__ import annotations

import numpy as np
import pytest
from audio import SR, encode

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
    import av
    import io

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
    with pytest.raises(BadInputError, match="not a supported audio file"):
        decode_audio(b"%PDF-1.4 definitely not audio" * 100)


def test_audio_looking_garbage():
    with pytest.raises(BadInputError, match="could not decode the audio as mp3"):
        decode_audio(b"\xff\xfb" + bytes(range(256)) * 20)


def test_session_description_is_never_handed_to_ffmpeg():
    # An SDP file makes FFmpeg's probing open RTP sockets; the allowlist refuses it outright.
    sdp = b"v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 127.0.0.1\nt=0 0\nm=audio 17050 RTP/AVP 0\n"
    with pytest.raises(BadInputError, match="not a supported audio file"):
        decode_audio(sdp)
    with pytest.raises(BadInputError, match="not a supported audio file"):
        decode_audio(b"#EXTM3U\n#EXT-X-TARGETDURATION:10\nhttp://127.0.0.1/a.ts\n")


def test_duration_limit_stops_decoding(tone):
    from tideserve.errors import PayloadTooLargeError

    data = encode(np.tile(tone, 8), "flac")  # 20 s
    with pytest.raises(PayloadTooLargeError, match="longer than the limit of 5 s"):
        decode_audio(data, max_duration_s=5)
    assert len(decode_audio(data, max_duration_s=30)) == 20 * SR


def test_non_finite_samples_refused_and_loud_ones_clipped():
    import io
    import av

    def wav_float(x):
        buf = io.BytesIO()
        with av.open(buf, "w", format="wav") as out:
            st = out.add_stream("pcm_f32le", rate=SR, layout="mono")
            fr = av.AudioFrame.from_ndarray(x.reshape(1, -1).astype(np.float32), format="flt", layout="mono")
            fr.sample_rate = SR
            for p in st.encode(fr):
                out.mux(p)
            for p in st.encode(None):
                out.mux(p)
        return buf.getvalue()

    x = np.zeros(SR, np.float32)
    x[100] = np.nan
    with pytest.raises(BadInputError, match="NaN or infinite"):
        decode_audio(wav_float(x))
    y = np.full(SR, 1e30, np.float32)
    assert np.abs(decode_audio(wav_float(y))).max() <= 1.0


def test_sample_rate_too_low():
    import struct

    rate, n = 100, 1000
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    data = struct.pack("<I", 2 * n)
    wav = b"RIFF" + struct.pack("<I", 36 + 2 * n) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + data + bytes(2 * n)
    with pytest.raises(BadInputError, match="sample rate 100 Hz is too low"):
        decode_audio(wav)


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
    with pytest.raises(BadInputError, match=r"no samples|could not decode"):
        decode_audio(wav)


def _pcm_wav(pcm: np.ndarray, tag: int = 1, bits: int = 16, riff_size: int | None = None,
             data_size: int | None = None) -> bytes:
    import struct

    body = pcm.astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", tag, 1, SR, SR * 2, 2, bits)
    riff = 36 + len(body) if riff_size is None else riff_size
    size = len(body) if data_size is None else data_size
    return b"RIFF" + struct.pack("<I", riff) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + \
        struct.pack("<I", size) + body


@pytest.mark.parametrize("unfilled", [0xFFFFFFFF, 0])
def test_a_wav_written_to_a_pipe_is_read_to_its_end(unfilled):
    """FFmpeg writing WAV to a pipe leaves the RIFF and data sizes at 0xFFFFFFFF (or 0): the
    samples are the bytes to the end of the file. An adversarial helper found a 3 s file refused
    as "longer than 3600 s" (the declared 2^31 - 1 frames were checked against the limit)."""
    from tideserve.errors import PayloadTooLargeError
    from tideserve.worker.audio import decode_pcm16

    pcm = (np.sin(np.arange(3 * SR) * 0.1) * 8000).astype(np.int16)
    wav = _pcm_wav(pcm, riff_size=unfilled, data_size=unfilled)
    out = decode_pcm16(wav, max_duration_s=3600)
    assert out.dtype == np.int16 and np.array_equal(out, pcm)
    with pytest.raises(PayloadTooLargeError, match="longer than the limit of 2 s"):
        decode_pcm16(wav, max_duration_s=2)
    assert len(decode_audio(wav)) == 3 * SR


@pytest.mark.parametrize("tag, bits", [(0x1234, 16), (1, 0)])
def test_an_audio_codec_ffmpeg_cannot_decode_is_bad_input(tag, bits):
    """A WAV whose format tag FFmpeg does not know (or with 0 bits a sample) has a stream without
    a decoder: a clear BadInputError, not an AttributeError (a 500, found by an adversarial helper)."""
    pcm = np.zeros(SR, np.int16)
    with pytest.raises(BadInputError, match="audio codec cannot be decoded here"):
        decode_audio(_pcm_wav(pcm, tag=tag, bits=bits))
