"""Shared fixtures: the English speech clips of pytest-audioeval, audio encoders, and
real `tideserve up` processes on loopback (see tests/endpoint.py)."""

from __future__ import annotations

import io
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

# tests/k8s starts a real control plane from binaries built by scripts/k8s/build.sh: `make test-k8s`
# runs it (TIDESERVE_K8S=1); plain `pytest` / `make test` leave it out.
collect_ignore = [] if os.environ.get("TIDESERVE_K8S") == "1" else ["k8s"]

import pytest_audioeval  # noqa: E402
from whisper_normalizer.english import EnglishTextNormalizer  # noqa: E402
import jiwer  # noqa: E402
from num2words import num2words  # noqa: E402

from endpoint import EndpointProcess, write_endpoint  # noqa: E402

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


@pytest.fixture(scope="session")
def en_clips() -> list[Clip]:
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


@pytest.fixture(scope="session")
def long_clip(en_clips: list[Clip]) -> Clip:
    """About 40 s: longer than Whisper's 30 s window, so it is transcribed in two windows.

    Order: fox, counting, hello world, four times. Whisper's English normaliser turns spelled
    single digits into one number ("one two ... ten" -> "12345678910") but leaves "1, 2, 3"
    as separate numbers, so a correct digit rendering of the counting clip scores a WER of
    about 0.8. Measured here: tiny.en writes the counting as words when the fox clip comes
    first, and as digits when the counting clip opens the file.
    """
    by_name = {c.name: c for c in en_clips}
    ordered = [by_name["quick_brown_fox"], by_name["counting"], by_name["hello_world"]]
    clip = join_clips(ordered, repeat=4, name="long")
    assert clip.duration_s > 30
    return clip


@pytest.fixture(scope="session")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> EndpointProcess:
    """The default example endpoint (tiny.en, one CPU pool scaling from zero) on a free
    loopback port: the first request of the session activates its replica."""
    tmp = tmp_path_factory.mktemp("default-endpoint")
    path = write_endpoint(tmp, min_replicas=None, gateway={"max_body_bytes": 8 * 1024 * 1024})
    with EndpointProcess(path, tmp) as ep:
        yield ep
