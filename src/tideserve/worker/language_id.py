"""Spoken-language identification beside an English-only model (issue 13): the settings the
engine process and the front share, and the one rule that says when speech is in a language
the model cannot transcribe.

Whisper identifies the language from the decoder's first position: the probabilities of the
language tokens after ``<|startoftranscript|>`` (Radford et al. 2022, section 2.3; faster-whisper's
``detect_language``). An English-only model has no language tokens, so a multilingual Whisper
model (``model.language_id.source``) does it on the first ``seconds`` of a request's first speech
window. The backend runs it (``WindowTask.identify_language``); the engine rejects or passes
the result on (``spec.models.LanguageId.on_other_language``); the front reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tideserve.worker.windows import frame_rms



@dataclass(frozen=True)
class LanguageIdConfig:
    """What the engine process needs (picklable): the identifier's model directory and the
    policy of ``spec.models.LanguageId``."""

    model_dir: str
    seconds: float = 10.0
    min_probability: float = 0.5
    reject: bool = False


def other_language(model_language_probability: float | None, min_probability: float,
                   detected: str | None = None, languages: frozenset[str] = frozenset()) -> bool:
    """Whether identification says the speech is in a language the model cannot transcribe:
    the identifier's probability of the model's own languages (English) together is under
    ``min_probability``, and the most probable language (``detected``) is not one of the model's
    ``languages`` (an uncertain identifier whose best guess is English has not heard another
    language: the adversarial pass saw 0.1 s of English answered "English 0.43" and refused).
    False when nothing was identified (None).

    Why the model's languages' probability and not the top language's: an uncertain identifier
    (short or unusual speech) spreads its probability over several other languages, none of which
    reaches the minimum, while English is still unlikely; on the shipped clips Polish "witaj
    swiecie" gave Portuguese 0.27 and Hindi "namaste duniya" Indonesian 0.39 (README, Languages)."""
    return (model_language_probability is not None and model_language_probability < min_probability
            and detected not in languages)


#: 20 ms frames; a frame within this many dB of the window's loudest counts as sound.
FRAME = 320
SOUND_DB_BELOW_PEAK = 30.0
LEAD_IN_S = 0.2


def speech_start(samples: np.ndarray, sample_rate: int = 16_000) -> int:
    """The sample where the identifier's ``seconds`` should start: ``LEAD_IN_S`` before the
    first 20 ms frame within ``SOUND_DB_BELOW_PEAK`` dB of the window's loudest (0 for a window
    with no such frame). A window may open with seconds of near silence (quiet noise, or digital
    silence inside a window that holds speech): heard from its first sample, 10 s of silence then
    English was identified as "nn" or "en 0.33" and refused (the adversarial pass)."""
    if len(samples) < FRAME:
        return 0
    rms = frame_rms(samples, FRAME)
    peak = float(rms.max())
    if peak <= 0:
        return 0
    loud = np.flatnonzero(rms >= peak * 10 ** (-SOUND_DB_BELOW_PEAK / 20))
    return max(0, int(loud[0]) * FRAME - round(LEAD_IN_S * sample_rate))


def mismatch_message(detected: str, probability: float, model_language_probability: float, model: str) -> str:
    """The error text a rejected request gets (and the log line of a flagged one)."""
    return (f"the speech is in language '{detected}' (probability {probability:.2f}; English "
            f"{model_language_probability:.2f}), but model '{model}' transcribes English only; send English "
            "speech, or use a multilingual model (e.g. examples/whisper-base.yaml), which transcribes that language")
