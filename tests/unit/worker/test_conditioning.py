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

from engine_run import BUNDLED, bundled_backend, decode_windows
from tideserve.sources.local import resolve_pkg
from tideserve.spec.models import Decoding
from tideserve.worker.backends.base import PreviousText, WindowResult, WindowTask
from tideserve.worker.backends.torch_whisper.backend import prompt_tokens, special_tokens
from tideserve.worker.backends.whisper_text import previous_tokens, window_result
from tideserve.worker.longform import PREVIOUS_DECODES, conditioning_context
from tideserve.worker.windows import split_windows

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

CONDITIONED = Decoding(beam_size=5, without_timestamps=False, condition_on_previous_text=True)


def test_previous_decodes_are_fed_back_as_their_tokens_or_their_text() -> None:
    previous = (PreviousText(tokens=(1000, 10, 11, 1220, 1220, 12, 1314)), PreviousText(text=" plain "),
                PreviousText(tokens=(1100, 13, 1200)))
    encode = lambda text: [ord(c) for c in " " + text]  # noqa: E731
    assert previous_tokens(None, previous, encode) == [
        1000, 10, 11, 1220, 1220, 12, 1314, *(ord(c) for c in " plain"), 1100, 13, 1200]
    # The client's prompt comes first, stripped; an empty one adds nothing.
    assert previous_tokens(" Hi ", previous[1:2], encode) == [*(ord(c) for c in " Hi"), *(ord(c) for c in " plain")]
    assert previous_tokens("  ", (), encode) == []


def test_a_decode_keeps_its_tokens_up_to_the_seek_point_timestamps_included() -> None:
    ts = 50363
    tokens = [ts, 383, 12029, ts + 220, ts + 220, 18435, 2159, ts + 314, ts + 314, 352, 12]  # the last unfinished
    r = window_result(WindowTask(np.zeros(16_000 * 20, dtype=np.int16)), tokens, "en", -0.2, 0.0,
                      eot=50256, timestamp_begin=ts, decode=lambda ids: " ".join(map(str, ids)))
    assert r.unfinished_from_s == pytest.approx(6.28)
    assert r.tokens == tuple(tokens[:8]) and r.segments == []  # no timestamps asked: no segments, the tokens still


@pytest.mark.parametrize(("tokens", "fed_back"), [
    # A last timestamp that only opens a next segment is not fed back; one past the window's
    # 27.75 s of audio is read as its end (the rest that preceded the count found in review).
    ([50363 + 1310, 18435, 2159, 13, 50363 + 1460, 50363 + 1460], (50363 + 1310, 18435, 2159, 13, 50363 + 1388)),
    # Text left open at the window's end is closed there.
    ([50363, 18435, 2159], (50363, 18435, 2159, 50363 + 1388)),
    # No timestamps at all: the tokens as written.
    ([18435, 2159, 13, 50256], (18435, 2159, 13)),
])
def test_what_a_decode_feeds_back_has_no_loose_ends(tokens, fed_back) -> None:
    task = WindowTask(np.zeros(int(16_000 * 27.75), dtype=np.int16), timestamps=True)
    r = window_result(task, tokens, "en", -0.2, 0.0, eot=50256, timestamp_begin=50363,
                      decode=lambda ids: " ".join(map(str, ids)))
    assert r.unfinished_from_s is None and r.tokens == fed_back


def test_the_context_keeps_decodes_in_order_and_resets_after_a_temperature_over_half() -> None:
    a = WindowResult(text="One.", language="en", tokens=(50363, 1, 50463))
    ctx = conditioning_context((), a, 0.0)
    assert ctx == (PreviousText(tokens=(50363, 1, 50463)),)
    ctx = conditioning_context(ctx, WindowResult(text=" Two. ", language="en"), 0.2)  # tokens not known
    assert ctx[1:] == (PreviousText(text="Two."),)
    assert conditioning_context(ctx, WindowResult(text="", language="en"), 0.0) == ctx  # a dropped rest
    # No text: nothing added, nothing reset (a lone timestamp; silence, which transcribe skips).
    assert conditioning_context(ctx, WindowResult(text="", language="en", tokens=(50363,)), 0.0) == ctx
    assert conditioning_context(ctx, WindowResult(text="", language="en", silent=True), 0.6) == ctx
    # Over 0.5: also when every temperature failed and the attempt kept is an earlier one (faster-whisper).
    assert conditioning_context(ctx, a, 0.6) == ()
    many = (PreviousText(text="x"),) * PREVIOUS_DECODES
    assert conditioning_context(many, a, 0.0)[-1] == PreviousText(tokens=(50363, 1, 50463))
    assert len(conditioning_context(many, a, 0.0)) == PREVIOUS_DECODES


def test_the_torch_backends_prompt_puts_the_clients_prompt_then_the_context() -> None:
    tok = Tokenizer.from_file(str(resolve_pkg(BUNDLED) / "tokenizer.json"))
    special = special_tokens(tok)
    ts = special.timestamp_begin
    kept = PreviousText(tokens=(ts + 50, 18435, 995, 13, ts + 175))
    ids = prompt_tokens(tok, special, False, None, True, "Glossary", context=(kept, PreviousText(text="Hi.")))
    assert ids == [tok.token_to_id("<|startofprev|>"), *tok.encode(" Glossary", add_special_tokens=False).ids,
                   *kept.tokens, *tok.encode(" Hi.", add_special_tokens=False).ids, special.sot]
    ids = prompt_tokens(tok, special, False, None, True, None, context=(kept,) * 100)  # 500 tokens: the last 223 stay
    assert len(ids) == 1 + 223 + 1 and ids[-2] == ts + 175


@pytest.fixture(scope="module")
def backend():
    return bundled_backend(CONDITIONED)


@pytest.mark.parametrize("timestamps", [True, False], ids=["verbose_json", "json"])
def test_a_conditioned_file_keeps_every_sentence(backend, en_clips, timestamps) -> None:
    # "json": the client asked for no segments (the decode still writes timestamps, the
    # endpoint's without_timestamps: false); a review found that case still fed back text alone.
    from longfiles import long_file

    import audio

    samples, reference = long_file(en_clips, 1, seed=13)
    windows = [((np.clip(w.samples, -1, 1) * 32767).astype(np.int16), w.offset_s) for w in split_windows(samples)]
    assert [round(o, 2) for _, o in windows] == [0.0, 27.75, 54.45]
    results, _ = decode_windows(backend, CONDITIONED, windows, timestamps=timestamps)
    text = " ".join(r.text for r in results)
    # Before: 0.305 (the second window one segment, 29 of its 54 words); now as `transcribe` (0.000).
    assert audio.wer(reference, text) == 0.0, text
    if timestamps:
        second = [s for r in results for s in r.segments if 27.75 <= s.start_s < 54.45]
        assert len(second) == 8  # its sentences, each a segment
