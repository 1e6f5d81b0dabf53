"""Decode an encoded audio file into 16 kHz mono float32 samples (PyAV/FFmpeg adapter).

Any container/codec FFmpeg reads (wav, flac, mp3, ogg/vorbis/opus, webm...) at any sample rate
and channel count; channels are mixed to mono and the rate converted by FFmpeg's resampler.
This is the only module that imports ``av``.
"""

from __future__ import annotations

import io
import struct

import av
import numpy as np

from tideserve.errors import BadInputError

SAMPLE_RATE = 16_000


def check_wav_complete(data: bytes) -> None:
    """Raise BadInputError if ``data`` is a RIFF/WAVE file whose ``data`` chunk is cut short.

    FFmpeg decodes a truncated WAV without complaint, silently losing the end of the speech,
    so the declared chunk size is checked against the bytes present.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = pos + 8
        if cid == b"data":
            # 0 and 0xFFFFFFFF mark a streamed WAV whose size was never filled in.
            if size not in (0, 0xFFFFFFFF) and body + size > len(data):
                raise BadInputError(
                    f"truncated WAV: its data chunk declares {size} bytes but only {len(data) - body} are present; "
                    "send the whole file"
                )
            return
        pos = body + size + (size & 1)
    raise BadInputError("truncated WAV: the file ends before its 'data' chunk; send the whole file")


def decode_audio(data: bytes) -> np.ndarray:
    """Decode ``data`` (an encoded audio file) to float32 samples, shape (n,), 16 kHz mono.

    Raises BadInputError for empty input, bytes that are not audio, truncated WAV files and
    audio with no samples.
    """
    if not data:
        raise BadInputError("audio is empty (0 bytes); send an encoded audio file such as wav, flac, mp3, ogg or webm")
    check_wav_complete(data)
    chunks: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise BadInputError("the file holds no audio stream; send wav, flac, mp3, ogg or webm audio")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
    except BadInputError:
        raise
    except (av.FFmpegError, ValueError, EOFError) as exc:
        raise BadInputError(
            f"could not decode the audio ({type(exc).__name__}: {exc}); send wav, flac, mp3, ogg or webm"
        ) from None
    samples = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise BadInputError("the audio decodes to no samples; send a file with at least some sound")
    return samples
