"""Speech clips and audio helpers for the tests: the English clips of pytest-audioeval, WER with
Whisper's English normaliser, and encoding to file formats with PyAV.

Imported by the tests and fixtures that need them (never at conftest import), so the pure unit
tier (`make test-unit`) runs without the media stack.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

import av
import jiwer
import numpy as np
import pytest_audioeval
from num2words import num2words
from whisper_normalizer.english import EnglishTextNormalizer

EN_DIR = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / "en"
SR = 16_000
_normalise = EnglishTextNormalizer()


@dataclass(frozen=True)
class Clip:
    name: str
    wav: bytes
    reference: str
    samples: np.ndarray  # 16 kHz mono float32

    @property
    def duration_s(self) -> float:
        return len(self.samples) / SR


def _spell_digits(text: str) -> str:
    text = re.sub(r"(?<=\d)(?:-|,\s+)(?=\d)", " ", text)  # "1-2-3" and "1, 2, 3" list numbers; "1,500" stays
    return re.sub(r"\d+", lambda m: " " + num2words(int(m.group())) + " ", text)


def wer(reference: str, hypothesis: str) -> float:
    """WER after Whisper's English text normaliser, numbers written as words on both sides first.

    Whisper's normaliser merges spelled single digits into one number ("one two three" ->
    "123") but keeps "1, 2, 3" or "1-2-3" as separate numbers, so a correct digit rendering
    would count as ~80% errors. Spelling listed digits as words (num2words) on both sides
    before the normaliser compares numbers in one form. Note that the normaliser concatenates
    runs of numbers either way, so it cannot tell "5 6 7" from "567".
    """
    return jiwer.wer(_normalise(_spell_digits(reference)), _normalise(_spell_digits(hypothesis)) or "<empty>")


def encode(samples: np.ndarray, fmt: str, rate: int = SR, channels: int = 1) -> bytes:
    """Encode 16 kHz mono float32 ``samples`` into a file of ``fmt`` (wav, flac, mp3, ogg, webm)
    at ``rate`` Hz with ``channels`` channels (resampled and duplicated by FFmpeg)."""
    codec, container_fmt = {
        "wav": ("pcm_s16le", "wav"), "flac": ("flac", "flac"), "mp3": ("libmp3lame", "mp3"),
        "ogg": ("libopus", "ogg"), "webm": ("libopus", "webm"),
    }[fmt]
    if codec == "libopus":
        rate = 48_000
    buf = io.BytesIO()
    layout = "mono" if channels == 1 else "stereo"
    with av.open(buf, mode="w", format=container_fmt) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        src = av.AudioFrame.from_ndarray(samples.reshape(1, -1).astype(np.float32), format="flt", layout="mono")
        src.sample_rate = SR
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout=layout, rate=rate)
        for frame in resampler.resample(src) + resampler.resample(None):
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def _decode_wav_file(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        r = av.AudioResampler(format="flt", layout="mono", rate=SR)
        parts = [f.to_ndarray().reshape(-1) for fr in c.decode(audio=0) for f in r.resample(fr)]
    return np.concatenate(parts).astype(np.float32)


def load_en_clips() -> list[Clip]:
    """Every English clip of pytest-audioeval with its reference text, decoded to 16 kHz mono."""
    clips = []
    for wav in sorted(EN_DIR.glob("*.wav")):
        clips.append(Clip(wav.stem, wav.read_bytes(), wav.with_suffix(".txt").read_text().strip(), _decode_wav_file(wav)))
    assert len(clips) >= 3, f"expected the English clips of pytest-audioeval in {EN_DIR}"
    return clips


def join_clips(clips: list[Clip], repeat: int, gap_s: float = 1.0, name: str = "joined") -> Clip:
    """One clip made of ``clips`` ``repeat`` times over, with ``gap_s`` of silence after each."""
    gap = np.zeros(int(gap_s * SR), np.float32)
    order = clips * repeat
    samples = np.concatenate([x for c in order for x in (c.samples, gap)])
    return Clip(name, encode(samples, "wav"), " ".join(c.reference for c in order), samples)
