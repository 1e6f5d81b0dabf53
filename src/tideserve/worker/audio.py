"""Decode an encoded audio file into 16 kHz mono float32 samples (PyAV/FFmpeg adapter).

Containers are recognised by their magic bytes and only an allowlist is handed to FFmpeg,
with the demuxer named explicitly: FFmpeg's own probing would also accept playlists and
session descriptions (SDP, HLS, concat) that open network sockets or other files. Accepted:
wav, flac, mp3, ogg (vorbis, opus, flac), webm/matroska, mp4/m4a, aiff, au, aac (ADTS); any
sample rate from 1 kHz up and any channel count: channels are mixed to mono and the rate
converted by FFmpeg's resampler. This is the only module that imports ``av`` (lazily: a WAV
file that is already 16 kHz mono 16-bit PCM, what most clients send, is read directly, without
FFmpeg and without converting its samples).
"""

from __future__ import annotations

import io
import struct
import wave
from collections.abc import Iterator

import numpy as np

from tideserve.errors import BadInputError, PayloadTooLargeError

SAMPLE_RATE = 16_000


def wav_data_chunk(data: bytes) -> tuple[int, int | None] | None:
    """Where a RIFF/WAVE file's ``data`` chunk starts and how many bytes it holds: ``(offset of
    its first byte, size)``, size None where the writer left it unfilled (0 or 0xFFFFFFFF, as
    FFmpeg and other streaming writers do when they cannot seek back: the bytes to the end of the
    file are the data); None for a file that is not RIFF/WAVE. Raises BadInputError for a file
    that ends before its ``data`` chunk or inside it."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = pos + 8
        if cid == b"data":
            if size in (0, 0xFFFFFFFF):
                return body, None
            if body + size > len(data):
                raise BadInputError(
                    f"truncated WAV: its data chunk declares {size} bytes but only {len(data) - body} are present; "
                    "send the whole file"
                )
            return body, size
        pos = body + size + (size & 1)
    raise BadInputError("truncated WAV: the file ends before its 'data' chunk; send the whole file")


def check_wav_complete(data: bytes) -> None:
    """Raise BadInputError if ``data`` is a RIFF/WAVE file whose ``data`` chunk is cut short.

    FFmpeg decodes a truncated WAV without complaint, silently losing the end of the speech,
    so the declared chunk size is checked against the bytes present (``wav_data_chunk``).
    """
    wav_data_chunk(data)


MIN_SAMPLE_RATE = 1000
_FORMATS = "wav, flac, mp3, ogg, webm, mp4/m4a, aiff, au or aac"


def sniff_format(data: bytes) -> str:
    """The FFmpeg demuxer for ``data``, from its magic bytes. Raises BadInputError for anything
    not on the allowlist."""
    head = data[:12]
    if (head[:4] == b"RIFF" and head[8:12] in (b"WAVE", b"RF64")) or head[:4] in (b"RF64", b"BW64"):
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"  # also webm
    if head[4:8] == b"ftyp":
        return "mov"  # mp4, m4a
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b".snd":
        return "au"
    if head[:3] == b"ID3":
        return "mp3"
    if len(head) >= 2 and head[0] == 0xFF:
        if head[1] & 0xF6 == 0xF0:
            return "aac"  # ADTS
        if head[1] & 0xE0 == 0xE0:
            return "mp3"  # MPEG audio frame sync
    raise BadInputError(f"not a supported audio file (unrecognised header {data[:8]!r}); send {_FORMATS}")


def _decode_chunks(data: bytes, max_duration_s: float | None) -> Iterator[np.ndarray]:
    """Decode ``data`` frame by frame, yielding 16 kHz mono float32 chunks; the duration limit
    is checked as the chunks come, so decoding stops as soon as it is passed (a small file
    cannot expand into hours of samples). Raises as ``decode_audio`` says."""
    if not data:
        raise BadInputError(f"audio is empty (0 bytes); send an encoded audio file: {_FORMATS}")
    fmt = sniff_format(data)
    if fmt == "wav":
        check_wav_complete(data)
    limit = None if max_duration_s is None else int(max_duration_s * SAMPLE_RATE)
    total = 0
    import av  # only here: the fast WAV path (pcm16_wav) needs no FFmpeg

    def too_long() -> PayloadTooLargeError:
        return PayloadTooLargeError(
            f"audio is longer than the limit of {max_duration_s:g} s (spec.gateway.max_audio_s); "
            "send a shorter file or raise the limit"
        )

    try:
        with av.open(io.BytesIO(data), mode="r", format=fmt, metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise BadInputError(f"the file holds no audio stream; send {_FORMATS}")
            stream = container.streams.audio[0]
            if stream.codec_context is None:  # FFmpeg knows no decoder for the stream's codec
                raise BadInputError(f"the file's audio codec cannot be decoded here; send {_FORMATS} "
                                    "with a common codec (e.g. PCM, FLAC, MP3, AAC, Opus, Vorbis)")
            rate = stream.codec_context.sample_rate or stream.rate or 0
            if rate and rate < MIN_SAMPLE_RATE:
                raise BadInputError(f"sample rate {rate} Hz is too low for speech; send audio at {MIN_SAMPLE_RATE} Hz or more")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1)
                    total += len(chunk)
                    if limit is not None and total > limit:
                        raise too_long()
                    yield chunk
            for out in resampler.resample(None):
                chunk = out.to_ndarray().reshape(-1)
                total += len(chunk)
                if limit is not None and total > limit:
                    raise too_long()
                yield chunk
    except (BadInputError, PayloadTooLargeError):
        raise
    except (av.FFmpegError, ValueError, EOFError, MemoryError, OverflowError) as exc:
        raise BadInputError(f"could not decode the audio as {fmt} ({type(exc).__name__}: {exc}); send {_FORMATS}") from None


def _check_chunk(chunk: np.ndarray) -> None:
    if not np.isfinite(chunk).all():
        raise BadInputError("the audio holds NaN or infinite samples; send real audio")


def decode_audio(data: bytes, max_duration_s: float | None = None) -> np.ndarray:
    """Decode ``data`` (an encoded audio file) to float32 samples, shape (n,), 16 kHz mono, in [-1, 1].

    Raises BadInputError for empty input, bytes that are not audio of an accepted format,
    truncated WAV files, sample rates under 1 kHz, non-finite samples and audio with no
    samples; PayloadTooLargeError when the audio is longer than ``max_duration_s`` seconds
    (decoding stops there: a small file cannot expand into hours of samples).
    """
    chunks = []
    for chunk in _decode_chunks(data, max_duration_s):
        _check_chunk(chunk)
        chunks.append(chunk)
    samples = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise BadInputError("the audio decodes to no samples; send a file with at least some sound")
    return np.clip(samples, -1.0, 1.0, out=samples)


def wav_file(pcm: np.ndarray) -> bytes:
    """int16 samples (16 kHz mono) as a RIFF/WAVE file (what ``pcm16_wav`` reads back unchanged)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(np.ascontiguousarray(pcm, dtype="<i2").tobytes())
    return buf.getvalue()


def pcm16_wav(data: bytes, max_duration_s: float | None = None) -> np.ndarray | None:
    """The samples of a complete RIFF/WAVE file that is already 16 kHz, mono, 16-bit PCM (read
    without FFmpeg, one copy), or None for any other file. A ``data`` chunk whose size was left
    unfilled (a WAV written to a pipe, ``wav_data_chunk``) holds the bytes to the end of the file.
    The duration limit is checked from the sizes before any sample is read. Raises
    PayloadTooLargeError past ``max_duration_s``; BadInputError for a truncated file."""
    chunk = wav_data_chunk(data)
    if chunk is None:
        return None
    body, size = chunk
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            if (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getcomptype()) != (1, 2, SAMPLE_RATE, "NONE"):
                return None
    except (wave.Error, EOFError, struct.error):
        return None  # FFmpeg decides (and names the problem)
    n = (len(data) - body if size is None else size) // 2
    if max_duration_s is not None and n > int(max_duration_s * SAMPLE_RATE):
        raise PayloadTooLargeError(
            f"audio is longer than the limit of {max_duration_s:g} s (spec.gateway.max_audio_s); "
            "send a shorter file or raise the limit"
        )
    if n == 0:
        return None
    return np.frombuffer(data, dtype="<i2", count=n, offset=body).astype(np.int16)


def decode_pcm16(data: bytes, max_duration_s: float | None = None) -> np.ndarray:
    """Decode ``data`` to int16 PCM, shape (n,), 16 kHz mono (full scale 32768 = 1.0).

    What the serving path keeps: 2 bytes a sample (1.92 MB per audio minute), converted chunk by
    chunk as FFmpeg decodes, so a request never holds its whole audio as float32. Raises as
    ``decode_audio``.
    """
    if data[:4] == b"RIFF":
        check_wav_complete(data)
        fast = pcm16_wav(data, max_duration_s)
        if fast is not None:
            return fast
    # One growing buffer, not a list of chunks joined at the end (that held the audio twice at
    # the peak); large reallocations move pages (mremap) rather than copy them.
    pcm = bytearray()
    for chunk in _decode_chunks(data, max_duration_s):
        _check_chunk(chunk)
        pcm += np.clip(np.rint(chunk * 32768.0), -32768, 32767).astype(np.int16).tobytes()
    if not pcm:
        raise BadInputError("the audio decodes to no samples; send a file with at least some sound")
    return np.frombuffer(pcm, dtype=np.int16)
