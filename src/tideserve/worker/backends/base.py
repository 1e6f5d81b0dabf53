"""The contract between the worker and a model backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tideserve.protocol.types import Segment
from tideserve.worker.timings import ExecutionTimings


@dataclass(frozen=True)
class Resume:
    """Decode a window again from ``from_s`` (seconds from the window's start) over the encoder
    output its earlier decode left, ``encoded`` (backend-private; ``WindowResult.encoded``):
    Whisper's seek without a second encoder pass (``worker.longform``, the resumed rest)."""

    from_s: float
    encoded: Any = field(repr=False, compare=False)


@dataclass(frozen=True)
class PreviousText:
    """What one accepted decode puts into the previous-text prompt of the request's next decodes
    when decoding conditions on previous text: the tokens it kept as the model wrote them
    (``WindowResult.tokens``: timestamp tokens included), or its text when those are not known."""

    tokens: tuple[int, ...] = ()
    text: str = ""


@dataclass(frozen=True)
class WindowTask:
    """One window (<= 30 s) of one request: 16 kHz mono ``samples`` (int16 PCM, or float32 in
    [-1, 1]) starting at ``offset_s`` in the file, with that request's prompt, language and
    timestamp wish, decoded at ``temperature`` (0: greedy/beam; > 0: sampling, Whisper's
    fallback); ``task`` is Whisper's task token (``transcribe`` or ``translate``)."""

    samples: np.ndarray
    offset_s: float = 0.0
    prompt: str | None = None
    language: str | None = None
    timestamps: bool = False
    temperature: float = 0.0
    task: str = "transcribe"  # or "translate" (into English; multilingual models only)
    words: bool = False  # align words in the segments (faster-whisper backend)
    #: Identify the spoken language of this window with the language-ID model (an English-only
    #: model with ``model.language_id``; ``worker.language_id``): the result's ``detected_*``.
    identify_language: bool = False
    #: Decode the window's rest from ``resume.from_s`` over its kept encoder output (a backend
    #: that sets ``resumes``); segment times stay relative to this window.
    resume: Resume | None = None
    #: With ``condition_on_previous_text``: what the request's earlier decodes kept since the last
    #: prompt reset, in audio order, put after ``prompt`` in the decoder's previous-text prompt
    #: (``whisper_text.previous_tokens``; ``longform.conditioning_context``).
    previous: tuple[PreviousText, ...] = ()
    #: This window's encoder output computed before its admission by a continuous backend's
    #: ``encode_ahead`` (backend-private), or None: the admission encodes it.
    ahead: Any = field(default=None, repr=False, compare=False)

    @property
    def duration_s(self) -> float:
        return len(self.samples) / 16_000


@dataclass
class WindowResult:
    """The decoded text of one window; segment times are absolute (offset added)."""

    text: str
    language: str
    segments: list[Segment] = field(default_factory=list)
    #: Seconds from the window's start where decoding stopped short, leaving the rest of the
    #: window untranscribed for a next window (Whisper's seek); None when the window is done.
    unfinished_from_s: float | None = None
    #: With ``unfinished_from_s``: the text of the last completed segment before it (the one an
    #: early closing timestamp cuts short; ``longform.repeats_tail``), whether or not
    #: ``segments`` are filled; "" otherwise.
    last_segment_text: str = ""
    #: Seconds from the window's start where the kept text ends: its last segment's closing
    #: timestamp, or the window's end for text left open (``split_by_timestamps``); None when
    #: nothing was written.
    text_end_s: float | None = None
    #: Seconds from the window's start where the text's last word ends by the model's
    #: cross-attention alignment (faster-whisper's ``find_alignment``, Whisper's word timestamps);
    #: set only for a resumed rest that does not seek on (``longform.resumed_rest_holds``).
    last_word_end_s: float | None = None
    #: Whisper's quality signals of this decode: mean log-probability per sampled token (the
    #: end-of-text included in the count), the no-speech probability at <|startoftranscript|>,
    #: and the gzip compression ratio of the text (high means repetition).
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    compression_ratio: float = 0.0
    #: True when the window was judged silence (its text is then empty).
    silent: bool = False
    #: True when one timestamped segment of the decode is over the compression-ratio threshold
    #: by itself: a segment repeating inside itself (``longform.loops``).
    looping_segment: bool = False
    #: With ``looping_segment``: the text without the segments that loop by themselves.
    loop_free_text: str | None = None
    #: With a segment that loops by itself faster than anyone speaks
    #: (``whisper_text.too_fast``): the text without those segments; None without one.
    fast_loop_free_text: str | None = None
    #: The probability of ``language`` when the model detected it (None when it was given).
    language_probability: float | None = None
    temperature: float = 0.0
    #: The language the language-ID model heard (``WindowTask.identify_language``), its
    #: probability, and the probability of the model's own languages together (English); None
    #: when it did not run. ``language`` stays the one transcribed.
    detected_language: str | None = None
    detected_language_probability: float | None = None
    model_language_probability: float | None = None
    #: Set by the engine (the one owner of ``model.language_id``'s rule): the speech is in a
    #: language the model cannot transcribe (``worker.language_id.other_language``).
    language_mismatch: bool = False
    #: The tokens this decode kept (those after a seek point are dropped), timestamp tokens
    #: included, end-of-text not: what conditioning on previous text feeds back, as
    #: openai/whisper's ``transcribe`` does. Empty when not known, or when the text was changed
    #: after decoding (looping segments removed, a repeated rest dropped).
    tokens: tuple[int, ...] = ()
    #: This window's encoder output, kept by a backend that ``resumes`` when the decode left a
    #: rest (``unfinished_from_s``), for the task that decodes the rest (``Resume``); the
    #: engine drops it once that task is made, so it never leaves the engine process.
    encoded: Any = field(default=None, repr=False, compare=False)


class Backend(Protocol):
    """A loaded model. ``transcribe_batch`` runs all tasks as ONE model execution.

    A backend may set ``resumes = True``: it then keeps a window's encoder output in the result
    of a decode that left a rest (``WindowResult.encoded``) and decodes a task with ``resume``
    from that point over it, with no second encoder pass.

    A backend may set ``background_lane = True``: the engine then calls
    ``transcribe_batch(tasks, background=True)`` for a long file's batches
    (``worker.batching.next_batch``), which it runs at the lower priority ``background_nice``
    asks for (faster-whisper: on a second copy of the model whose threads are niced).

    Constructed as ``cls(model_dir, target, decoding, cpu_threads=…, max_batch_size=…,
    instances=…, language_id=…, background_nice=…)`` (``language_id``: a
    ``worker.language_id.LanguageIdConfig`` or None; a backend that can identify languages sets
    ``identifies_language``; ``background_nice``: the spec's ``batching.background_nice``); a backend that
    preallocates per batch (the torch backend's KV cache) sizes
    itself by ``max_batch_size`` (the endpoint's ``batching.max_batch_size``); one whose
    ``transcribe_batch`` may be called from ``instances`` threads at once prepares for that
    (faster-whisper: CTranslate2 workers)."""

    #: Language codes the model can transcribe (e.g. {"en"} for an English-only model).
    languages: frozenset[str]

    def transcribe_batch(self, tasks: list[WindowTask]) -> tuple[list[WindowResult], ExecutionTimings]: ...
