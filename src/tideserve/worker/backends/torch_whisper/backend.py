"""Backend adapter: a Hugging Face-format Whisper directory -> batched transcription on PyTorch.

One execution = log-mel features of every window (on the device), one batched encoder pass,
and one batched greedy decode over a static KV cache with the step replayed as a CUDA graph
(decode.py). Rules and thresholds follow Whisper's reference decoder at temperature 0, as the
faster-whisper backend does, so both backends give the same text for the same weights (the
converter's parity test checks this on CPU).

Targets: ``cuda-smXY-{bf16,fp16,fp32}`` runs only on a GPU of compute capability X.Y (checked
against ``torch.cuda.get_device_capability`` before loading: EngineMismatchError otherwise);
``cpu-<isa>-fp32`` runs on the CPU (tests, parity). Beam search is not implemented: the
backend refuses ``beam_size`` > 1 with a clear error.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any
from pathlib import Path

import torch
from tokenizers import Tokenizer

from tideserve.errors import EngineMismatchError
from tideserve.spec.models import Decoding, Target
from tideserve.worker.backends.base import PreviousText, WindowResult, WindowTask
from tideserve.worker.backends.torch_whisper.decode import GreedyDecoder, SpecialTokens
from tideserve.worker.backends.torch_whisper.features import LogMel
from tideserve.worker.backends.torch_whisper.identify import Heard, LanguageIdentifier, language_tokens
from tideserve.worker.backends.torch_whisper.model import (CompiledEncoder, GraphedEncoder, Whisper,
                                                           load_hf_dir, require_triton_device)
from tideserve.worker.backends.whisper_text import MAX_LENGTH, previous_tokens, window_result
from tideserve.worker.language_id import LanguageIdConfig
from tideserve.worker.timings import ExecutionTimings

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# Symbols Whisper never transcribes as speech (its reference decoder's non-speech list); each
# is suppressed when the tokenizer spells it as one token, with or without a leading space.
_NON_SPEECH = ([*list('"#()*+/:;<=>@[\\]^_`{|}~「」『』'), "<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[", "('", '("',
                "((", "))", "(((", ")))", "[[", "]]", "{{", "}}", "♪♪", "♪♪♪", "♩", "♪", "♫", "♬", "♭", "♮", "♯"])

_LANGS_EN_ONLY = frozenset({"en"})


def _token(tok: Tokenizer, text: str) -> int:
    i = tok.token_to_id(text)
    if i is None:
        raise ValueError(f"the tokenizer has no {text} token; is this a Whisper tokenizer.json?")
    return i


def special_tokens(tok: Tokenizer) -> SpecialTokens:
    """The ids the decoder needs, from a Whisper ``tokenizer.json``. Raises ValueError when one
    is missing."""
    no_ts = _token(tok, "<|notimestamps|>")
    no_speech = tok.token_to_id("<|nospeech|>") or _token(tok, "<|nocaptions|>")
    suppress = set()
    for sym in _NON_SPEECH:
        for variant in (sym, " " + sym):
            ids = tok.encode(variant, add_special_tokens=False).ids
            if len(ids) == 1:
                suppress.add(ids[0])
    suppress.add(tok.encode(" -", add_special_tokens=False).ids[0])
    suppress.add(tok.encode(" '", add_special_tokens=False).ids[0])
    return SpecialTokens(eot=_token(tok, "<|endoftext|>"), sot=_token(tok, "<|startoftranscript|>"),
                         no_timestamps=no_ts, timestamp_begin=no_ts + 1, no_speech=no_speech,
                         blank=tok.encode(" ", add_special_tokens=False).ids[0], suppress=tuple(sorted(suppress)))


def prompt_tokens(tok: Tokenizer, special: SpecialTokens, multilingual: bool, language: str | None,
                  timestamps: bool, previous: str | None, task: str = "transcribe",
                  context: Sequence[PreviousText] = ()) -> list[int]:
    """Whisper's decoder prompt: [<|startofprev|> previous… context…] <|startoftranscript|>
    [<|lang|> <|transcribe|> or <|translate|>] [<|notimestamps|>]. ``previous`` (the client's
    prompt) is encoded as plain text: a client's "<|endoftext|>" or "<|startoftranscript|>" becomes
    ordinary tokens, never control tokens (OpenAI Whisper's tokenizer refuses special tokens in
    text by default; here they are neutralised instead of failing the request). ``context``: what the
    request's earlier decodes kept when decoding conditions on previous text, as
    ``whisper_text.previous_tokens`` writes it. Together they keep their last 223 tokens."""
    out: list[int] = []
    tok.encode_special_tokens = True  # no other text this tokenizer encodes has special tokens
    ids = previous_tokens(previous, context, lambda text: tok.encode(" " + text, add_special_tokens=False).ids)
    if ids:
        out = [_token(tok, "<|startofprev|>"), *ids[-(MAX_LENGTH // 2 - 1):]]
    out.append(special.sot)
    if multilingual:
        out += [_token(tok, f"<|{language or 'en'}|>"), _token(tok, f"<|{task}|>")]
    if not timestamps:
        out.append(special.no_timestamps)
    return out


class TorchWhisperBackend:
    """Load ``model_dir`` (Hugging Face format: config.json, model.safetensors, tokenizer.json)
    for ``target``.

    Raises EngineMismatchError when the target's device, architecture or compute type cannot
    run here, ValueError when the directory is not a Whisper model or decoding asks for beam
    search. ``run_ahead``: see ``GreedyDecoder`` (0 turns it off; None, the default, paces it by the
    measured step time, and ``chunk_steps`` gives the engine the chunk that goes with it). ``language_id``: beside an
    English-only model, a multilingual one that hears the language of the windows that ask
    (``WindowTask.identify_language``; ``identify.LanguageIdentifier``, on the same device and
    dtype); a multilingual model identifies languages itself and ignores it. ``cross_fp8``: the
    cross-attention keys and values in FP8 (``model.KVCache``; CUDA only); ``attention``: the
    decoder step's attention kernels (``model.Whisper``); default ``triton`` with FP8 keys and
    values, else ``sdpa``. Why: with FP8 the Triton self-attention took large-v3's step from 8.52
    to 7.33 ms (H200, batch 64, the FP8 attention at 64 positions per block then,
    ``bench/gpu_step_parts.py --fp8``); without it the evidence is
    mixed: tiny.en's engine alone ran 9,864 audio-s/s against 7,840 with PyTorch's kernels on an
    H100 (side by side), but 8,873 on an H200 against 8,937 in an earlier run there, and a served
    28-s window (no timestamps) then lost one sentence group that PyTorch's kernels and Hugging
    Face write (served against ``generate``: WER 0.018 against 0.000; greedy decoding turns on
    rounding), so without FP8 the default stays with PyTorch's kernels. ``compile_encoder``: the
    encoder through ``torch.compile`` (``model.CompiledEncoder``); default on for CUDA models too
    wide for the encoder's CUDA graphs (large-v3, H200, engine alone at batch 64 with FP8: 950
    audio-s/s against 887 eager, ``bench/results/gpu_e2e_large_v3_h200_fp8_compiled.json``); where
    the encoder's CUDA graphs are on, they win and it is ignored. ``compile_decoder``: the whole decoder
    step (the model's step, the logit rules, the state update) through ``torch.compile``
    (``GreedyDecoder(compile_step=True)``); default on for the models whose encoder is compiled by
    default (``CompiledEncoder.enabled_for``, whatever ``compile_encoder`` says) when the attention
    is Triton's (large-v3 with FP8 keys and values; ``GreedyDecoder.compiles_step_for`` gives the
    measurements), off otherwise. ``encoder_gelu_epilogue``: each encoder layer's fc1 product and
    its GELU in one BLAS call (``Whisper.fuse_encoder_gelu``, which gives the measurements; on CUDA
    the tanh-approximate GELU); default on where the encoder is compiled, off otherwise.
    ``cross_absorbed`` (with ``cross_fp8``): the cross-attention reads one FP8 copy of the
    encoder's output with each layer's projections absorbed (``cuda_kernels``), not FP8 keys and
    values; an experiment, off by default. ``overlap_encoder``: on a GPU every encoder pass (with
    its features) runs on a CUDA stream of its own at the lowest priority and the decoder's work
    on a stream of a higher one, so that windows encoded before their admission (``encode_ahead``,
    which ``EngineLoop(encode_ahead=N)`` drives) are encoded while the rows decode, the decoder's
    kernels taking the multiprocessors first as they free up, where otherwise each admission's
    encoder pass stops every row's steps; an experiment, off by default (README, The served path
    (21)). On the CPU it changes nothing.
    """

    def __init__(self, model_dir: Path, target: Target, decoding: Decoding, cpu_threads: int = 0,
                 max_batch_size: int = 64, use_cuda_graphs: bool | None = None,
                 encoder_graphs: bool | None = None, instances: int = 1, run_ahead: int | None = None,
                 language_id: LanguageIdConfig | None = None, background_nice: int = 0,
                 cross_fp8: bool = False, attention: str | None = None,
                 compile_encoder: bool | None = None, compile_decoder: bool | None = None,
                 encoder_gelu_epilogue: bool | None = None, cross_absorbed: bool = False,
                 overlap_encoder: bool = False) -> None:
        del instances, background_nice  # continuous batching: one decode loop holds every slot
        self.device = _device_for(target)
        # (the encoder's stream, the decoder's) with overlap_encoder on a GPU; lower numbers are
        # higher priorities, 0 the lowest and the default stream's (CUDA runtime API, stream priorities)
        self._streams = (torch.cuda.Stream(self.device, priority=0), torch.cuda.Stream(self.device, priority=-1)) \
            if overlap_encoder and self.device.type == "cuda" else None
        if decoding.beam_size != 1:
            raise ValueError(f"the torch backend decodes greedily; set model.decoding.beam_size: 1 "
                             f"(got {decoding.beam_size})")
        if self.device.type == "cpu":
            if cpu_threads:
                torch.set_num_threads(cpu_threads)
        else:
            # On a GPU the engine does no CPU math worth parallelising, and torch's intra-op CPU
            # threads (one per core by default) spin after each small host op: on the H200 machine
            # they kept 10 of 16 cores busy and, with the cores oversubscribed, made each admission's
            # host work take ~40 ms instead of ~1.5 ms (bench/gpu_admit_probe.py, gpu_e2e.py).
            torch.set_num_threads(cpu_threads or 1)
        dtype = DTYPES[target.backend_compute_type]
        if self.device.type == "cpu" and dtype != torch.float32:
            raise EngineMismatchError(f"{target.name}: the torch backend runs fp32 on the CPU")
        model_dir = Path(model_dir)
        try:
            self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise ValueError(f"{model_dir}: no readable tokenizer.json ({exc})") from None
        self.model: Whisper = load_hf_dir(model_dir, dtype, self.device)
        attention = attention or ("triton" if cross_fp8 else "sdpa")
        if attention not in Whisper.ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(Whisper.ATTENTION)}, got {attention!r}")
        if attention == "triton":
            require_triton_device(self.device, "the Triton attention kernels", "use attention='sdpa'")
            self.model.fuse_qkv()
        self.model.attention = attention
        self.special = special_tokens(self.tokenizer)
        self.multilingual = self.model.dims.vocab_size >= 51865
        self.languages = (frozenset(language_tokens(self.tokenizer)) or _LANGS_EN_ONLY) if self.multilingual \
            else _LANGS_EN_ONLY
        self._identifier = None if language_id is None or self.multilingual else LanguageIdentifier(
            Path(language_id.model_dir), dtype, self.device, language_id.seconds, self.languages, max_batch_size,
            graphs=None if use_cuda_graphs is not False else False)
        self.identifies_language = self._identifier is not None
        self.decoding = decoding
        self.features = LogMel(self.model.dims.num_mel_bins, self.device)
        if compile_decoder is None:
            compile_decoder = GreedyDecoder.compiles_step_for(self.model, self.device)
        self.decoder = GreedyDecoder(self.model, self.special, max_batch=max_batch_size,
                                     use_cuda_graphs=use_cuda_graphs, run_ahead=run_ahead, cross_fp8=cross_fp8,
                                     cross_absorbed=cross_absorbed, compile_step=compile_decoder)
        graph_encoder = ((use_cuda_graphs is not False and GraphedEncoder.enabled_for(self.model, self.device))
                         if encoder_graphs is None else encoder_graphs and self.device.type == "cuda")
        if compile_encoder is None:
            compile_encoder = not graph_encoder and CompiledEncoder.enabled_for(self.model, self.device)
        if encoder_gelu_epilogue is None:
            encoder_gelu_epilogue = compile_encoder and not graph_encoder  # where the encoder is compiled
        if encoder_gelu_epilogue:
            self.model.fuse_encoder_gelu()
        self.encode: Callable[[torch.Tensor], torch.Tensor] = (
            GraphedEncoder(self.model, max_batch_size) if graph_encoder
            else CompiledEncoder(self.model, max_batch_size) if compile_encoder else self.model.encode)
        # busy slot -> its task, language, and the language-ID probabilities heard (with its row)
        self._rows: dict[int, tuple[WindowTask, str, tuple[Heard, int] | None]] = {}
        self._encoder_events: collections.deque[tuple[Any, Any]] = collections.deque()  # (start, end) not yet read
        if self._streams:  # the weights, the cache and the compiled warm-ups were queued on the current stream
            for stream in self._streams:
                stream.wait_stream(torch.cuda.current_stream(self.device))
        # CUDA graphs are captured on first use of each (batch bucket, span), not here: capturing
        # all of them at load (GreedyDecoder.capture_all) doubled a tiny replica's load on the
        # H200 (6.7 s -> 14.0 s, 18 graphs) and did not change a 64-request burst's p50
        # (1.11 s vs 1.15 s), so scale-from-zero is served better lazily.

    def prompt(self, language: str | None, timestamps: bool, previous: str | None,
               task: str = "transcribe", context: Sequence[PreviousText] = ()) -> list[int]:
        """Whisper's decoder prompt (see ``prompt_tokens``)."""
        return prompt_tokens(self.tokenizer, self.special, self.multilingual, language, timestamps, previous, task,
                             context)

    # --- continuous batching (worker.engine drives these) -----------------------------------

    @property
    def free_slots(self) -> int:
        return self.decoder.free_slots

    @property
    def chunk_steps(self) -> int | None:
        """Decoder steps per round the measured step time asks for (``GreedyDecoder.chunk_steps``);
        None: the engine's default."""
        return self.decoder.chunk_steps

    def _prompts(self, tasks: list[WindowTask]) -> tuple[list[str], list[bool], list[list[int]]]:
        languages = [t.language or self.decoding.language or "en" for t in tasks]
        with_ts = [t.timestamps or self.decoding.without_timestamps is False for t in tasks]
        prompts = [self.prompt(lang, ts, t.prompt, t.task, t.previous)
                   for t, lang, ts in zip(tasks, languages, with_ts, strict=True)]
        return languages, with_ts, prompts

    def _identify(self, tasks: list[WindowTask]) -> list[tuple[Heard, int] | None]:
        """Per task: its language probabilities (not yet read: the call's and its row) when it
        asks for identification and this backend has an identifier; None otherwise."""
        out: list[tuple[Heard, int] | None] = [None] * len(tasks)
        idx = [i for i, t in enumerate(tasks) if t.identify_language]
        if self._identifier is not None and idx:
            heard = self._identifier.probabilities([tasks[i].samples for i in idx])
            for j, i in enumerate(idx):
                out[i] = (heard, j)
        return out

    def _on(self, which: int) -> Any:
        """The context in which the encoder's (0) or the decoder's (1) device work is queued: its
        stream with ``overlap_encoder`` on a GPU, else the current one."""
        return torch.cuda.stream(self._streams[which]) if self._streams else contextlib.nullcontext()

    def _encode_tasks(self, tasks: list[WindowTask], keep: bool) -> tuple[torch.Tensor, Any, float]:
        """Features and one encoder pass for ``tasks`` (on the encoder's stream with
        ``overlap_encoder``): ``[n, 1500, d_model]``, the CUDA event after it (None on the CPU),
        and the host seconds of the features. ``keep``: the output is held past the next pass
        (``encode_ahead``), so a graphed encoder's output buffer is copied out, as it is whenever
        the decoder reads it on another stream. The device time is read later (``_encoder_gpu_s``)."""
        cuda = self.device.type == "cuda"
        with self._on(0):
            t0 = time.perf_counter()
            if cuda:  # GPU time of the features and encoder, read once the device has done them
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            feats = self.features([t.samples for t in tasks]).to(self.decoder.dtype)
            t1 = time.perf_counter()
            encoded = self.encode(feats)
            if (keep or self._streams) and isinstance(self.encode, GraphedEncoder):
                encoded = encoded.clone()  # the next pass would overwrite it before the decoder reads it
            if not cuda:
                return encoded, None, t1 - t0
            end.record()
        self._encoder_events.append((start, end))
        return encoded, end, t1 - t0

    def _encoder_gpu_s(self) -> float:
        """Device seconds of the encoder passes whose events have completed since the last call:
        no synchronisation, so each pass is counted once the device has done it (the stage's
        total is exact; it lags by about one admission)."""
        gpu_s = 0.0
        while self._encoder_events and self._encoder_events[0][1].query():
            a, b = self._encoder_events.popleft()
            gpu_s += a.elapsed_time(b) / 1000.0
        return gpu_s

    @staticmethod
    def ahead_ready(handle: Any) -> bool:
        """Whether the pass that encoded ``handle`` (one of ``encode_ahead``'s) has finished on
        the device, so that admitting its window makes no row's steps wait (always on the CPU)."""
        return handle.ready is None or handle.ready.query()

    @torch.inference_mode()
    def encode_ahead(self, tasks: list[WindowTask]) -> tuple[list[Any], ExecutionTimings]:
        """Features and one encoder pass for ``tasks`` before their admission, queued without
        waiting for the device (with ``overlap_encoder`` beside the decode chunk queued before);
        returns one handle per task, for ``WindowTask.ahead`` (then ``admit`` takes it instead of
        encoding), and the features' host seconds (input) and the encoder's seconds (infer: on a
        GPU the device time read so far, as ``admit``'s). Raises ValueError for no windows or more
        than ``max_batch_size``."""
        if not 0 < len(tasks) <= self.decoder.max_batch:
            raise ValueError(f"encode_ahead takes 1..{self.decoder.max_batch} windows, got {len(tasks)}")
        t0 = time.perf_counter()
        encoded, ready, input_s = self._encode_tasks(tasks, keep=True)
        handles: list[Any] = [_Ahead(encoded[i], ready) for i in range(len(tasks))]
        infer_s = self._encoder_gpu_s() if ready is not None else time.perf_counter() - t0 - input_s
        return handles, ExecutionTimings(input_s=input_s, infer_s=infer_s)

    @torch.inference_mode()
    def admit(self, tasks: list[WindowTask]) -> tuple[list[int], ExecutionTimings]:
        """Features and one encoder pass for ``tasks`` (those without an ``ahead`` handle of
        ``encode_ahead``), then their rows join the running decode. Returns one handle (slot) per
        task and the time of the features (input) and the encoder (infer). Raises ValueError for
        more tasks than free slots or a bad prompt."""
        t0 = time.perf_counter()
        languages, with_ts, prompts = self._prompts(tasks)
        fresh = [t for t in tasks if t.ahead is None]
        input_s = time.perf_counter() - t0
        encoded: torch.Tensor | None = None
        ready = None
        if fresh:
            encoded, ready, features_s = self._encode_tasks(fresh, keep=False)
            input_s += features_s
        with self._on(1):
            cur = torch.cuda.current_stream() if self.device.type == "cuda" else None
            if cur is not None and encoded is not None and ready is not None and self._streams:
                cur.wait_event(ready)
                encoded.record_stream(cur)  # made on the encoder's stream: not reused before this one reads it
            if encoded is None or len(fresh) < len(tasks):  # rows encoded ahead, and this pass's, in task order
                fresh_rows = iter(encoded if encoded is not None else ())
                rows = [t.ahead.encoded if t.ahead is not None else next(fresh_rows) for t in tasks]
                if cur is not None:
                    for t in tasks:
                        if t.ahead is not None:
                            cur.wait_event(t.ahead.ready)
                            t.ahead.encoded.record_stream(cur)
                encoded = torch.stack(rows)
            slots = self.decoder.admit(encoded, prompts, with_ts, max_new_tokens=self.decoding.max_new_tokens,
                                       temperatures=[t.temperature for t in tasks],
                                       min_new_tokens=self.decoding.min_new_tokens)
            heard = self._identify(tasks)
        t2 = time.perf_counter()
        for slot, task, lang, h in zip(slots, tasks, languages, heard, strict=True):
            self._rows[slot] = (dataclasses.replace(task, ahead=None) if task.ahead is not None else task, lang, h)
        if cur is None:
            return slots, ExecutionTimings(input_s=input_s, infer_s=t2 - t0 - input_s)
        # No synchronisation here: the encoder runs on the device while this thread goes on
        # (queues the next decode chunk); the features' host work is timed on the host.
        return slots, ExecutionTimings(input_s=input_s, infer_s=self._encoder_gpu_s())

    def run(self, steps: int) -> None:
        """``steps`` decoder steps for every row decoding now."""
        with self._on(1):
            self.decoder.run(steps)

    def finished(self) -> tuple[list[tuple[int, WindowResult]], float]:
        """Rows that ended, as window results, and the seconds spent detokenizing them."""
        with self._on(1):
            rows = self.decoder.finished()
        t0 = time.perf_counter()
        out = [(slot, self._result(*self._rows.pop(slot), row)) for slot, row in rows]
        return out, time.perf_counter() - t0

    def release(self, slots: list[int]) -> None:
        """Stop the rows of ``slots`` (their request went away)."""
        with self._on(1):
            self.decoder.release(slots)
        for s in slots:
            self._rows.pop(s, None)

    def _result(self, task: WindowTask, lang: str, heard: tuple[Heard, int] | None, row) -> WindowResult:
        s, d = self.special, self.decoding
        avg = row.sum_logprob / (len(row.tokens) + 1)
        out = window_result(task, row.tokens, lang, avg, row.no_speech_prob, s.eot, s.timestamp_begin,
                            lambda ids: self.tokenizer.decode(ids), d.no_speech_threshold, d.log_prob_threshold,
                            d.compression_ratio_threshold)
        if heard is None or self._identifier is None:
            return out
        detected, probability, ours = self._identifier.read(*heard)
        return dataclasses.replace(out, detected_language=detected, detected_language_probability=probability,
                                   model_language_probability=ours)

    # --- one static batch ---------------------------------------------------------------------

    @torch.inference_mode()
    def transcribe_batch(self, tasks: list[WindowTask]) -> tuple[list[WindowResult], ExecutionTimings]:
        """Run all ``tasks`` as one execution (at most max_batch_size windows, on an idle
        decoder); results in order."""
        t0 = time.perf_counter()
        languages, with_ts, prompts = self._prompts(tasks)
        feats = self.features([t.samples for t in tasks]).to(self.decoder.dtype)
        t1 = time.perf_counter()
        encoded = self.encode(feats)
        rows = self.decoder.decode(encoded, prompts, with_ts, max_new_tokens=self.decoding.max_new_tokens,
                                   temperatures=[t.temperature for t in tasks],
                                   min_new_tokens=self.decoding.min_new_tokens)
        heard = self._identify(tasks)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        out = [self._result(task, lang, h, row) for task, lang, h, row in zip(tasks, languages, heard, rows, strict=True)]
        t3 = time.perf_counter()
        return out, ExecutionTimings(input_s=t1 - t0, infer_s=t2 - t1, output_s=t3 - t2)


@dataclasses.dataclass(frozen=True)
class _Ahead:
    """One window's encoder output from ``encode_ahead``: a row ``[1500, d_model]`` of its
    pass's output and the CUDA event after which it is written (None on the CPU)."""

    encoded: torch.Tensor
    ready: Any


def _device_for(target: Target) -> torch.device:
    """The torch device for ``target``; raises EngineMismatchError when this machine cannot run it."""
    if target.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise EngineMismatchError(f"engine target {target.name} needs a CUDA GPU; torch sees none here")
    major, minor = torch.cuda.get_device_capability(0)
    here = f"sm{major}{minor}"
    if here != target.arch:
        raise EngineMismatchError(f"engine target {target.name} is built for {target.arch}, but this GPU is {here}; "
                                  f"build an engine for cuda-{here}-{target.compute_type}")
    return torch.device("cuda", 0)
