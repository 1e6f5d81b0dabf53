"""faster-whisper (CTranslate2) backend: Whisper on CPU, windows of many requests in one batch.

One execution = feature extraction for every window, encoder passes of ``ENCODE_BATCH``
windows each, and one batched ``generate`` call (beam search) over all windows with a prompt
per window, so requests with different prompts, languages and timestamp wishes share the batch. This is
the only module that imports faster_whisper / ctranslate2.

Decoding follows Whisper's reference rules as faster-whisper applies them: non-speech tokens
suppressed, blank suppressed at the start, first timestamp at most 1.0 s, and a window whose
no-speech probability exceeds 0.6 while its average log-probability is below -1.0 is taken
as silence (Whisper's ``no_speech_threshold`` / ``logprob_threshold`` defaults). Temperature
fallback is not applied (deterministic decoding at temperature 0).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.audio import pad_or_trim
from faster_whisper.tokenizer import _LANGUAGE_CODES, Tokenizer
from faster_whisper.transcribe import get_suppressed_tokens

from tideserve.errors import EngineMismatchError
from tideserve.spec.models import Decoding, Target
from tideserve.protocol.types import Word
from tideserve.worker.backends.base import WindowResult, WindowTask
from tideserve.worker.backends.whisper_text import MAX_LENGTH as _MAX_LENGTH
from tideserve.worker.backends.whisper_text import SAMPLE_RATE as _SAMPLE_RATE
from tideserve.worker.backends.whisper_text import TIME_PRECISION_S as _TIME_PRECISION_S
from tideserve.worker.backends.whisper_text import previous_tokens, window_result
from tideserve.worker.cores import intra_op_threads, lane_threads, on_lowered_thread, one_blas_thread, usable_cores
from tideserve.worker.language_id import LanguageIdConfig, speech_start
from tideserve.worker.timings import ExecutionTimings

log = logging.getLogger("tideserve.worker.backends.faster_whisper")

#: Windows per CTranslate2 encoder pass. One at a time cost less CPU per window than a batch of
#: 8 on this 2-core Xeon with tiny.en int8: 0.52 s against 0.62 s on two intra-op threads (every
#: round lower), 0.48 s against 0.57 s on one (noisier) (bench/encoder_batch.py,
#: bench/results/encoder_batch.txt); on the 20-minute file the whole pipeline took a median 0.90x
#: the batched pipeline's time one at a time against 1.01x at 8, faster in two rounds of three
#: (bench/longfile_speed.py --encode-batch 1,8, bench/results/longfile_speed.txt). Measured for
#: that model and machine only; the output is the same (test).
#: ``generate`` keeps the whole batch: on two threads one window alone cost more per window (1.27 s
#: against 0.86 s at 8, beam 5). The language-ID model (``_Identifier``) still encodes its batch
#: in one pass.
ENCODE_BATCH = 1


class _Identifier:
    """Spoken-language identification with a multilingual Whisper model (``worker.language_id``):
    its encoder over ``seconds`` of each window that asks for it, from where its sound starts
    (``worker.language_id.speech_start``), zero-padded to ``seconds`` (CTranslate2's Whisper encoder
    takes fewer than 3,000 frames), then ``detect_language`` (the language tokens' probabilities at
    the decoder's first position). Always padded to ``seconds``, so that a window's verdict does
    not depend on the windows identified beside it: padded to the longest of its call, a 0.5 s
    English clip was heard as Korean alone and as English beside 12 s requests (the adversarial
    pass). On the shipped clips of 9 languages (Whisper base, 2 cores) the first 10 s padded gave
    the same English / not English answer as the clip's own length and a padded 30 s (3 of 3
    English clips kept, 23 of 24 others flagged), the most probable language right on 23 of 27
    (21 at the clip's own length), at 0.15 s per call instead of 0.06 s (README, Languages).

    Raises EngineMismatchError when ``model_dir`` is not a multilingual Whisper model."""

    def __init__(self, model_dir: Path, target: Target, cpu_threads: int, instances: int, seconds: float,
                 languages: frozenset[str]) -> None:
        try:
            self._model = WhisperModel(str(model_dir), device="cpu", compute_type=target.backend_compute_type,
                                       cpu_threads=cpu_threads, num_workers=instances)
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineMismatchError(f"cannot load the language-ID model {model_dir}: {exc}") from None
        if not self._model.model.is_multilingual:
            raise EngineMismatchError(f"the language-ID model {model_dir} is English-only; model.language_id.source "
                                      "must be a multilingual Whisper model (e.g. Whisper base)")
        self._max_frames = round(seconds * 100)  # 10 ms hop
        self._languages = languages

    def identify(self, tasks: list[WindowTask]) -> list[tuple[str, float, float] | None]:
        """Per task: ``(language code, its probability, the probability of the transcribing
        model's languages together)`` for those with ``identify_language`` set, None for the
        others."""
        idx = [i for i, t in enumerate(tasks) if t.identify_language]
        out: list[tuple[str, float, float] | None] = [None] * len(tasks)
        if not idx:
            return out
        fe = self._model.feature_extractor
        n = self._max_frames
        starts = {i: speech_start(tasks[i].samples) for i in idx}
        feats = np.stack([pad_or_trim(fe(_float32(tasks[i].samples[starts[i]: starts[i] + n * _HOP]))[..., :-1], n)
                          for i in idx])
        detected = self._model.model.detect_language(self._model.encode(feats.astype(np.float32)))
        for i, ranked in zip(idx, detected, strict=True):  # every language, most probable first
            token, probability = ranked[0]
            ours = sum(float(p) for t, p in ranked if t.strip("<|>") in self._languages)
            out[i] = (token.strip("<|>"), float(probability), ours)
        return out


def prompt_ids(tok: Tokenizer, prompt: str | None) -> list[int]:
    """Token ids of a client's previous-text prompt ([] for none), as plain text: "<|endoftext|>"
    or "<|startoftranscript|>" in it become ordinary tokens, never control tokens (OpenAI
    Whisper's tokenizer refuses special tokens in text; here they are neutralised)."""
    if not prompt or not prompt.strip():
        return []
    tok.tokenizer.encode_special_tokens = True  # no other text this tokenizer encodes has special tokens
    return tok.encode(" " + prompt.strip())


class FasterWhisperBackend:
    """Load a CTranslate2 Whisper model from ``model_dir`` for ``target`` (CPU only here).

    ``instances``: CTranslate2 workers (``num_workers``, sharing one copy of the weights), so
    that many ``transcribe_batch`` calls from as many threads run at once, each on
    ``cpu_threads`` intra-op threads (0: ``worker.cores.intra_op_threads``: the cores, at most
    4, as CTranslate2's default of 4 but no more threads than cores per instance; measured on 2 cores with 3 instances, a 5-minute
    file took 15.3 s at 2 threads, 17.9 s at 4; bench/fairness.py).

    ``background_nice`` > 0 with 2 or more instances: a second copy of the model (loaded by the
    first batch that needs it), with ``instances`` - 1 workers made on a thread whose nice value
    is the process's plus that much (``worker.cores.on_lowered_thread``; CTranslate2's worker
    threads and their OpenMP threads inherit it), runs the batches the engine puts in the background lane
    (``transcribe_batch(tasks, background=True)``; ``worker.batching.next_batch``). Up to
    ``instances`` - 1 of the lane's batches run at once, so each of its workers gets the cores
    divided among them (``lane_threads``; 1 with the default instances on up to 8 cores) where the first
    copy's workers keep all the cores for a short request alone: the lane's batches at 2 threads
    each put 4 threads on 2 cores, and the 20-minute file of bench/longfile_speed.py ran 4-10%
    slower so in 4 of 5 rounds (README, Accuracy: the lane's threads). ``cpu_threads`` > 0 sets
    both.

    Raises EngineMismatchError when the target is not a CPU target or its compute type is not
    supported by this CPU.
    """

    def __init__(self, model_dir: Path, target: Target, decoding: Decoding, cpu_threads: int = 0,
                 max_batch_size: int | None = None,  # batches of any size: no preallocation
                 instances: int = 1, language_id: LanguageIdConfig | None = None, background_nice: int = 0) -> None:
        if target.device != "cpu":
            raise EngineMismatchError(
                f"the faster-whisper backend runs CPU targets here; {target.name} needs a CUDA backend"
            )
        cores = usable_cores()
        threads = cpu_threads or intra_op_threads(cores)
        one_blas_thread()  # the lanes fill the cores; numpy's BLAS threads would contend with them

        def load(workers: int, threads: int = threads) -> WhisperModel:
            return WhisperModel(str(model_dir), device="cpu", compute_type=target.backend_compute_type,
                                cpu_threads=threads, num_workers=workers)

        try:
            self._model = load(instances)
        except ValueError as exc:  # e.g. "Requested int8 compute type, but the target device ... does not support"
            raise EngineMismatchError(f"cannot load {model_dir} for {target.name}: {exc}") from None
        self._decoding = decoding
        self._multilingual = bool(self._model.model.is_multilingual)
        self.languages = frozenset(_LANGUAGE_CODES) if self._multilingual else frozenset({"en"})
        # A multilingual model identifies the language itself; an English-only one uses the
        # language-ID model when the endpoint has one.
        self._identifier = None if language_id is None or self._multilingual else _Identifier(
            Path(language_id.model_dir), target, threads, instances, language_id.seconds,
            self.languages)
        self.identifies_language = self._identifier is not None
        #: The background lane's copy, loaded by the first batch that runs there (so a replica
        #: that never sees a long file neither loads it nor waits for it at start).
        self.background_lane = background_nice > 0 and instances >= 2
        self._background: WhisperModel | None = None
        self.lane_threads = cpu_threads or lane_threads(cores, instances)
        self._load_background = lambda: on_lowered_thread(background_nice,
                                                          lambda: load(instances - 1, self.lane_threads))
        self._background_lock = threading.Lock()
        self._tokenizers: dict[tuple[str | None, str], Tokenizer] = {}
        base = self._tokenizer(decoding.language or "en")
        self._suppress = list(get_suppressed_tokens(base, [-1]))
        #: Keep a window's encoder output for its rest after a seek and decode the rest over it
        #: (``WindowTask.resume``; README, Accuracy: the resumed rest). False: every rest is
        #: encoded again from its own audio, as openai/whisper's ``transcribe`` does.
        self.resumes = True

    def _tokenizer(self, language: str | None, task: str = "transcribe") -> Tokenizer:
        key = (language if self._multilingual else None, task if self._multilingual else "transcribe")
        tok = self._tokenizers.get(key)
        if tok is None:
            tok = Tokenizer(self._model.hf_tokenizer, self._multilingual, task=key[1], language=key[0] or "en")
            self._tokenizers[key] = tok
        return tok

    def transcribe_batch(self, tasks: list[WindowTask], background: bool = False
                         ) -> tuple[list[WindowResult], ExecutionTimings]:
        """Run all ``tasks`` as one execution; results in the order of ``tasks``; on the
        background lane's copy of the model when ``background`` and there is one (the results
        are the same; only the CPU priority differs).

        Features of the windows not resumed are computed and encoded (``_encode``); a resumed
        window (``task.resume``) brings its kept encoder output instead. CTranslate2's
        ``generate`` needs <|startoftranscript|> at the same position and the same number of
        task tokens after it across a batch (<|notimestamps|> counts as one; a resumed window's
        forced timestamp does not, it is a prefix, which may differ by row), so windows are
        decoded in groups of equal prompt shape before that prefix, and temperature: one group
        in the common case of requests without a prompt.
        """
        model = self._background_model() if background and self.background_lane else self._model
        if not tasks:
            return [], ExecutionTimings()
        t0 = time.perf_counter()
        fe = model.feature_extractor
        fresh = [i for i, t in enumerate(tasks) if t.resume is None]
        feats = np.stack([self._features(fe, tasks[i].samples) for i in fresh]).astype(np.float32) if fresh else None
        t1 = time.perf_counter()

        # The encoder output of every window, [windows, 1500, d_model] float32: resumed windows
        # bring the one kept from their first decode.
        rows = self._encode(model, feats) if feats is not None else None
        if rows is None or len(fresh) < len(tasks):
            stack: list[Any] = [t.resume.encoded.encoder_output if t.resume is not None else None for t in tasks]
            for j, row in zip(fresh, rows if rows is not None else (), strict=True):
                stack[j] = row
            rows = np.stack(stack)
        encoded = ctranslate2.StorageView.from_array(rows)
        requested = [t.language or self._decoding.language for t in tasks]
        languages: list[str]
        probabilities: list[float | None] = [None] * len(tasks)
        if not self._multilingual:
            languages = ["en"] * len(tasks)
        elif any(lang is None for lang in requested):
            detected = model.model.detect_language(encoded)  # per window: [(token, probability)], best first
            languages = [lang or det[0][0].strip("<|>") for lang, det in zip(requested, detected, strict=True)]
            probabilities = [None if lang else float(det[0][1]) for lang, det in zip(requested, detected, strict=True)]
        else:
            languages = [lang for lang in requested if lang is not None]
        prompts, toks = [], []
        groups: dict[tuple[int, int, float], list[int]] = {}
        for i, (task, lang) in enumerate(zip(tasks, languages, strict=True)):
            tok = self._tokenizer(lang, task.task)
            previous = previous_tokens(task.prompt, task.previous, functools.partial(prompt_ids, tok))
            with_timestamps = task.timestamps or self._decoding.without_timestamps is False
            prompt = model.get_prompt(tok, previous, without_timestamps=not with_timestamps)
            sot = prompt.index(tok.sot)
            groups.setdefault((sot, len(prompt) - sot, task.temperature), []).append(i)
            prompts.append(prompt + _resume_prefix(tok, task))
            toks.append(tok)
        decoded: list = [None] * len(tasks)
        for (_, _, temperature), idx in groups.items():
            enc = encoded if len(groups) == 1 else ctranslate2.StorageView.from_array(rows[idx])
            group_prompts = [prompts[i] for i in idx]
            max_length = _MAX_LENGTH
            if self._decoding.max_new_tokens is not None:
                max_length = min(_MAX_LENGTH, len(group_prompts[0]) + self._decoding.max_new_tokens)
            # Temperature 0: beam search (or greedy); above 0: one sampled hypothesis (Whisper's fallback).
            sampling = dict(beam_size=1, sampling_temperature=temperature, sampling_topk=0) if temperature > 0 \
                else dict(beam_size=self._decoding.beam_size)
            res = model.model.generate(
                enc,
                group_prompts,
                **sampling,
                max_length=max_length,
                return_scores=True,
                return_no_speech_prob=True,
                suppress_blank=True,
                suppress_tokens=self._suppress,
                max_initial_timestamp_index=round(1.0 / _TIME_PRECISION_S),
            )
            for i, r in zip(idx, res, strict=True):
                decoded[i] = r
        identified = self._identifier.identify(tasks) if self._identifier is not None else [None] * len(tasks)
        t2 = time.perf_counter()
        out = [dataclasses.replace(self._window_result(task, tok, lang, r), language_probability=p,
                                   detected_language=ident[0] if ident else None,
                                   detected_language_probability=ident[1] if ident else None,
                                   model_language_probability=ident[2] if ident else None)
               for task, tok, lang, r, p, ident in zip(tasks, toks, languages, decoded, probabilities, identified,
                                                       strict=True)]
        # A rest left by a seek is decoded over this window's encoder output (``resumes``), except
        # with word timestamps, whose alignment reads the window from its start.
        keep = [self.resumes and r.unfinished_from_s is not None and not t.words for t, r in zip(tasks, out, strict=True)]
        # The text tokens of what a kept or resumed decode wrote, tokenized once for both uses.
        spoken = {i: _spoken(toks[i], out[i]) for i, t in enumerate(tasks) if keep[i] or t.resume is not None}
        if any(keep):
            out = [dataclasses.replace(r, encoded=_Kept(
                rows[i].copy() if task.resume is None else task.resume.encoded.encoder_output, _written(task, spoken[i])))
                if k else r for i, (task, r, k) in enumerate(zip(tasks, out, keep, strict=True))]
        for i, task in enumerate(tasks):  # where a resumed rest's last word ends
            if task.resume is not None and spoken[i]:
                out[i] = dataclasses.replace(out[i], last_word_end_s=self._last_word_end(model, task, toks[i],
                                                                                         spoken[i]))
        for i, task in enumerate(tasks):
            if task.words and out[i].segments:
                one = encoded if len(tasks) == 1 else ctranslate2.StorageView.from_array(rows[[i]])
                out[i] = self._with_words(model, task, toks[i], one, out[i])
        t3 = time.perf_counter()
        return out, ExecutionTimings(input_s=t1 - t0, infer_s=t2 - t1, output_s=t3 - t2)

    def _background_model(self) -> WhisperModel:
        """The background lane's copy of the model, loaded on first use (once, under a lock).
        When it cannot be loaded (e.g. out of memory), the lane is given up with a warning and
        every batch runs on the first copy, at the same priority."""
        if self._background is not None:  # loaded: no lock on every batch
            return self._background
        with self._background_lock:
            if self._background is None and self.background_lane:
                try:
                    self._background = self._load_background()
                except Exception as exc:  # whatever the loader raises: the lane is not worth failing requests
                    log.warning("no background lane: cannot load a second copy of the model (%s: %s); long files "
                                "now run at the priority of short requests", type(exc).__name__, exc)
                    self.background_lane = False
            return self._background if self._background is not None else self._model

    @staticmethod
    def _features(fe, samples: np.ndarray) -> np.ndarray:
        """Log-mel features ``[n_mels, 3000]`` of one window's ``samples`` (int16 PCM or float in
        [-1, 1], 16 kHz) by faster-whisper's ``fe`` (``model.feature_extractor``), padded or
        trimmed to 30 s, as ``transcribe`` computes them."""
        return pad_or_trim(fe(_float32(samples))[..., :-1])

    @staticmethod
    def _encode(model: WhisperModel, feats: np.ndarray) -> np.ndarray:
        """The encoder output ``[windows, 1500, d_model]`` (float32) of log-mel ``feats``
        ``[windows, n_mels, 3000]`` (float32), computed ``ENCODE_BATCH`` windows at a time."""
        if len(feats) <= ENCODE_BATCH:
            return np.asarray(model.encode(feats))  # no copy: the array holds the StorageView
        return np.concatenate([np.asarray(model.encode(feats[i:i + ENCODE_BATCH]))
                               for i in range(0, len(feats), ENCODE_BATCH)])

    @staticmethod
    def _last_word_end(model: WhisperModel, task: WindowTask, tok: Tokenizer,
                       text_tokens: tuple[int, ...]) -> float | None:
        """Seconds from a resumed window's start where the last word of ``text_tokens`` (its
        rest's text) ends, by faster-whisper's cross-attention alignment (``find_alignment``); None
        when no word has a letter or digit, or when the alignment fails (the rest is then decoded
        again from its own audio).

        First the rest's text alone over the kept encoder output from the seek point on
        (``task.resume.from_s``, one encoder position per 20 ms: ``_aligned_end``). When that
        puts the last word's end within ``SUSPECT_END_S`` of the window's end, the window's
        whole text over the whole encoder output decides (``_Kept.text_tokens``): a rest that
        stopped before the speech in its part of the window did (the lost words
        ``longform.resumed_rest_holds`` looks for) has its last word stretched to the window's
        end when aligned alone, and would be kept. Found in review: "The Quick Brown Fox" of a
        rest that went on with "jumps over the lazy dog. Hello world" ended at 28.62 s of a
        28.65 s window aligned alone, at 24.76 s over the whole window; over the rests of
        bench/accuracy.py's 10-minute (seed 32, beam 1) and 20-minute (seed 15, beam 5) files with
        their last words dropped, 39 of 134 went from decoded again to kept (and one the other
        way), every one with its end within 0.06 s of the window's end; with the second alignment
        none did (the reviewer's script, re-run: one went the other way, a counting rest cut after
        "9," that ends 0.06 s earlier and is decoded again).

        Why not always the whole text: the alignment's cost grows with its tokens (CTranslate2
        computes each one's probability over the vocabulary) and its frames. On the 20-minute
        file at beam 5 (2 cores, int8, one thread) the 24 resumed rests took 191 ms in all
        against 2,202 ms for the window's whole text, and each last word's end came out within
        0.14 s of the one over the whole window (21 earlier, 2 the same, one 0.04 s later); on the
        10-minute file five rests within 0.18 s, among them the one
        ``longform.resumed_rest_holds`` cites, which lost "Hello world": "dog" ends at 26.34 s
        instead of 26.16 s, with the same 0.76 s of sound after it (``windows.sound_s``), so that
        rest is still decoded again. The rest's text alone over the whole window does not work:
        its words were placed over the speech before the seek (17 of 24 ends moved by 0.8-25 s),
        because the model attends to the first speech that matches."""
        if task.resume is None or task.resume.encoded is None:
            return None
        kept, window_s = task.resume.encoded, len(task.samples) / _SAMPLE_RATE
        try:
            end = _aligned_end(model, tok, kept.encoder_output, text_tokens, len(task.samples),
                               round(task.resume.from_s / _TIME_PRECISION_S))
            if end is not None and end >= window_s - SUSPECT_END_S:
                end = _aligned_end(model, tok, kept.encoder_output, (*kept.text_tokens, *text_tokens),
                                   len(task.samples), 0)
        except (ValueError, RuntimeError) as exc:  # e.g. more text than the decoder's 448 positions
            log.warning("no word alignment for a resumed rest at %.2f s (%s); it is decoded again", task.offset_s, exc)
            return None
        return end

    @staticmethod
    def _with_words(model: WhisperModel, task: WindowTask, tok: Tokenizer, encoded,
                    result: WindowResult) -> WindowResult:
        """``result`` with each segment's words timed by faster-whisper's cross-attention alignment
        (``WhisperModel.add_word_timestamps``: the alignment heads and dynamic time warping, as
        Whisper's word timestamps), with its default punctuation merging."""
        # Timed from the window's start and moved to the file's time after: faster-whisper rounds
        # each word's time to 0.01 s and compares word lengths with thresholds, so on the file's
        # time a window's words could come out otherwise than in a part of a spread file starting
        # there (a first word 0.44 s apart, found by adversarial testing).
        off = task.offset_s
        subs: list[dict[str, Any]] = [
            {"seek": 0, "start": s.start_s - off, "end": s.end_s - off, "tokens": list(s.tokens)} for s in result.segments]
        model.add_word_timestamps([subs], tok, encoded, len(task.samples) // _HOP, _PREPEND, _APPEND,
                                  last_speech_timestamp=0.0)
        segments = [dataclasses.replace(s, start_s=sub["start"] + off, end_s=sub["end"] + off, words=tuple(
            Word(w["start"] + off, w["end"] + off, w["word"], float(w["probability"])) for w in sub.get("words") or ()))
            for s, sub in zip(result.segments, subs, strict=True)]
        return dataclasses.replace(result, segments=segments)

    def _window_result(self, task: WindowTask, tok: Tokenizer, language: str, res) -> WindowResult:
        generated = list(res.sequences_ids[0])  # CTranslate2 returns a forced prefix with the sampled tokens
        avg_logprob = res.scores[0] * len(generated) / (len(generated) + 1)  # length_penalty 1 (faster-whisper)
        prefix = _resume_prefix(tok, task)
        tokens = generated if generated[: len(prefix)] == prefix else prefix + generated
        d = self._decoding
        return window_result(task, tokens, language, avg_logprob, res.no_speech_prob, tok.eot, tok.timestamp_begin,
                             tok.decode, d.no_speech_threshold, d.log_prob_threshold, d.compression_ratio_threshold)


# faster-whisper's transcribe() defaults (which are Whisper's): punctuation joined to the next or
# the previous word.
_PREPEND = "\"'“¿([{-"
_APPEND = "\"'.。,，!！?？:：”)]}、"  # noqa: RUF001 (full-width marks on purpose: CJK punctuation)


#: Samples per log-mel frame (10 ms at 16 kHz: Whisper's hop of 160), the unit of the frame
#: counts faster-whisper's alignment takes.
_HOP = _SAMPLE_RATE // 100

#: A resumed rest's last word aligned alone (``FasterWhisperBackend._last_word_end``) ending
#: within this many seconds of its window's end is aligned again with the window's whole text.
#: Every misplaced end found in review lay within 0.06 s of it; a speech-filled rest rarely does,
#: since windows are cut in pauses.
SUSPECT_END_S = 0.1


def _aligned_end(model: WhisperModel, tok: Tokenizer, encoder_output: np.ndarray, text_tokens: Sequence[int],
                 samples: int, first: int) -> float | None:
    """Seconds from the window's start where the last word with a letter or digit of
    ``text_tokens`` ends, aligned (faster-whisper's ``find_alignment``) over ``encoder_output``
    (``[1500, d_model]`` float32, the window's) from encoder position ``first`` (20 ms each) on,
    for a window of ``samples`` samples at 16 kHz; None when no word has a letter or digit or
    fewer than two feature frames (10 ms) are left. Raises what ``find_alignment`` raises.

    CTranslate2 takes an input whose second dimension is the model's mel bin count as features
    to encode, not as an encoder output (``WhisperEncoder::is_encoded``), so a slice of exactly
    that many positions starts one position earlier (found in review: a seek at 28.40 s was
    encoded again, and its last word came out 0.7 s late)."""
    if len(encoder_output) - first == model.model.n_mels and first > 0:
        first -= 1
    frames = samples // _HOP - 2 * first  # feature frames, two per encoder position
    if frames < 2:
        return None
    one = ctranslate2.StorageView.from_array(np.ascontiguousarray(encoder_output[None, first:]))
    (words,) = model.find_alignment(tok, [list(text_tokens)], one, frames)
    ends = [float(w["end"]) for w in words if any(c.isalnum() for c in w["word"])]
    return first * _TIME_PRECISION_S + ends[-1] if ends else None


@dataclasses.dataclass(frozen=True)
class _Kept:
    """What a decode that seeks keeps for its resumed rest (``WindowResult.encoded``): the
    window's encoder output ``[1500, d_model]`` float32, decoded over again from the seek point,
    and the text tokens written before the seek point (re-encoded from the text kept), for the
    rest's alignment over the whole window when its own is suspect
    (``FasterWhisperBackend._last_word_end``)."""

    encoder_output: np.ndarray
    text_tokens: tuple[int, ...]


def _spoken(tok: Tokenizer, result: WindowResult) -> tuple[int, ...]:
    """The text tokens of ``result``'s text (stripped, after one space, as Whisper writes it);
    () when it wrote nothing."""
    text = result.text.strip()
    return tuple(tok.encode(" " + text)) if text else ()


def _written(task: WindowTask, spoken: tuple[int, ...]) -> tuple[int, ...]:
    """The text tokens of ``task``'s window written so far: before a resumed task's start, then
    ``spoken`` (``_spoken`` of this decode)."""
    before = task.resume.encoded.text_tokens if task.resume is not None else ()
    return (*before, *spoken)


def _resume_prefix(tok: Tokenizer, task: WindowTask) -> list[int]:
    """The timestamp token a resumed decode starts from, forced after the prompt ([] when the
    task is not resumed): the model writes the rest of the window from that time on."""
    if task.resume is None:
        return []
    return [tok.timestamp_begin + round(task.resume.from_s / _TIME_PRECISION_S)]


def _float32(samples: np.ndarray) -> np.ndarray:
    """Samples as float32 in [-1, 1] (int16 PCM is scaled by 1/32768)."""
    if samples.dtype == np.int16:
        return samples.astype(np.float32) / 32768.0
    return samples.astype(np.float32, copy=False)
