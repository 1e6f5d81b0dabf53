"""Batched decoding for Whisper over a static KV cache, one CUDA graph per step, with
continuous (in-flight) batching: rows are slots that windows join and leave at any step.

Every row carries its own prompt (``<|startoftranscript|>`` … task tokens … and an optional
previous-text prompt before it) and position, so requests with different prompts share one
batch; a row still inside its prompt is fed its next prompt token (teacher forcing), a row past
it its last sampled token. The whole step — model, logit rules, argmax, state update — is one
static-shape function of preallocated buffers, captured once per batch size as a CUDA graph
and replayed (no host sync per token; the host checks completion every few steps).

Logit rules, as OpenAI Whisper's decoder and CTranslate2 apply them at temperature 0:
- suppressed tokens (non-speech symbols and special tokens other than end-of-text and
  timestamps) never win; at the first sampled position blank (" ") and end-of-text are
  suppressed too (``suppress_blank``);
- without timestamps every timestamp token is suppressed; with timestamps the rules of
  ``ApplyTimestampRules``: the first token is a timestamp no later than ``max_initial_timestamp``
  (1.0 s); timestamps come in pairs (after "text <|t|>" no text; after "<|t|><|t|>" no
  timestamp); they never decrease; when the timestamp tokens' total probability exceeds the
  best text token's, a timestamp is forced;
- ``min_new_tokens`` suppresses end-of-text until that many tokens (used by benchmarks to fix
  the decode length, as ``generate(min_new_tokens=…)`` does).
A row with a temperature > 0 samples from softmax(logits / T) over the tokens the rules allow
(Gumbel-max: argmax of logits / T plus Gumbel noise), as Whisper's temperature fallback does;
its log-probability is still read from the unscaled logits (Whisper's ``sum_logprobs``).
Source: Radford et al. 2022 (Whisper), section 4.5 and its reference decoder.

Continuous batching (``admit`` / ``run`` / ``finished``): each slot of the preallocated state is a
row of its own window, with its own prompt, position, token limit and stop. A chunk of steps
runs over the slots ``[:b]`` (``b`` a power-of-two bucket covering the highest busy slot; free
slots are marked done and change nothing); between chunks, finished rows leave and new windows
join (their cross-attention K/V written into their slots), so a row that runs to the token
limit holds only its own slot. This is the in-flight batching of TensorRT-LLM and vLLM applied
to Whisper's decoder; ``decode`` (one static batch) is the same machinery run to completion.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tideserve.worker.backends.torch_whisper.model import (CompiledEncoder, KVCache, Whisper, compile_batch_dynamic,
                                                         pow2_bucket)

_NEG_INF = float("-inf")

#: Seconds of device work the steps run ahead should cover: the engine thread's host work
#: between two chunks (reading ended rows, turning them into text, admitting). Calibrated on
#: tiny.en (an eager step of about 1.0 ms at batch 64 on an H100): served at 256 clients, 8
#: steps ahead gave 8,006 audio-s/s against 7,338 with 4 on one machine, and 12 or 16 were
#: within the machines' noise of 8 (README "Serving path", (4) and (9)).
HOST_ROUND_S = 0.008
#: The most steps run ahead (a paced chunk is twice the steps ahead, so at most 16): 32-step
#: chunks served less than 16 at tiny size (``worker.engine.DEFAULT_CHUNK_STEPS``).
MAX_AHEAD_STEPS = 8

log = logging.getLogger("tideserve.worker.torch")


def decode_pace(step_s: float, host_round_s: float = HOST_ROUND_S, max_ahead: int = MAX_AHEAD_STEPS) -> tuple[int, int]:
    """``(chunk_steps, run_ahead)`` for a decoder step of ``step_s`` seconds of device time.

    Run ahead enough steps to cover ``host_round_s`` (at least 1, at most ``max_ahead``) and
    make a chunk twice that, so that the host's round is hidden behind the device. A slot whose
    row ends idles from the steps run ahead to a chunk plus them, less one (the rest of the
    chunk it ended in, then the steps queued before the next admission), and an idle step
    costs the same device time whatever the model, so both are counted in time, not steps:
    tiny.en's ~1 ms step keeps 16 and 8 (as tuned there); large-v3's 5.5 ms step gets 4 and 2
    (a freed slot idles 2-5 steps, where 16 and 8 left it 8-23 of a window's ~100): its engine
    alone at batch 64 (FP8 keys and values, H100) ran 1,004 audio-s/s at 4 and 2 against 949-955
    at 16 and 8 (600 requests; 1,002-1,017 with chunks of 2-8 and 1-2 ahead), and paced 1,015
    against 971 in one run of 2,000 requests, 996 against 953 in another (600 requests;
    ``bench/results/gpu_engine_pace_h100.json``).
    Raises ValueError for a step_s that is not > 0."""
    if not step_s > 0:
        raise ValueError(f"a step takes a positive time; got {step_s} s")
    ahead = max(1, min(max_ahead, math.ceil(host_round_s / step_s - 1e-9)))
    return 2 * ahead, ahead


class StepTimes:
    """The device time of one decoder step per batch bucket, from timed chunks: the least
    time per step over a bucket's last ``keep`` chunks. The least, because a chunk's events
    also count any gap in which the device waited for the host (the engine thread held up
    between two launches): such gaps only lengthen a chunk, and would otherwise shorten the
    steps run ahead exactly when the host is slow. ``pace_for(b)`` is ``decode_pace`` of that
    time, or None until bucket ``b`` has been measured."""

    def __init__(self, keep: int = 16) -> None:
        self._recent: dict[int, collections.deque[float]] = {}
        self.keep = keep
        self.step_s: dict[int, float] = {}

    def observe(self, bucket: int, steps: int, seconds: float) -> None:
        """``steps`` steps of ``bucket`` rows took ``seconds``; ignored unless both are > 0."""
        if steps <= 0 or not seconds > 0:
            return
        recent = self._recent.setdefault(bucket, collections.deque(maxlen=self.keep))
        recent.append(seconds / steps)
        self.step_s[bucket] = min(recent)

    def pace_for(self, bucket: int) -> tuple[int, int] | None:
        """``(chunk_steps, run_ahead)`` for ``bucket`` rows, or None when not measured yet."""
        s = self.step_s.get(bucket)
        return None if s is None else decode_pace(s)


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a fresh CPU tensor) on ``device`` without a host-device synchronisation: from
    pageable memory CUDA stages the bytes before ``cudaMemcpyAsync`` returns, so ``host`` may be
    freed at once, and the copy is ordered on the stream before the kernels that read it
    (CUDA runtime API, "API synchronization behavior"). ``torch.tensor(..., device=cuda)``
    instead waits for every kernel queued before it, which stalled admissions behind the
    running decode chunk."""
    return host.to(device, non_blocking=True)


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids the rules need. ``timestamp_begin`` is ``<|0.00|>``; ids >= it are timestamps."""

    eot: int
    sot: int
    no_timestamps: int
    timestamp_begin: int
    no_speech: int
    blank: int
    suppress: tuple[int, ...]


@dataclass
class RowResult:
    """One row's output: sampled tokens (end-of-text excluded), their summed log-probability,
    the no-speech probability at ``<|startoftranscript|>``, and whether it ended by end-of-text."""

    tokens: list[int]
    sum_logprob: float
    no_speech_prob: float
    ended: bool


class GreedyDecoder:
    """Decode batches of up to ``max_batch`` rows with ``model``.

    ``use_cuda_graphs`` (default: on CUDA) captures the step per (batch size, attention span)
    bucket on first use. ``compile_step`` runs the whole step through ``torch.compile``: the
    model's step with the logit rules and the state update (see ``compiles_step_for``).
    ``max_prompt`` bounds prompt length in tokens (Whisper: at most half the 448-token context is
    previous text). ``run_ahead`` (steps, >= 0): once ``finished`` knows which rows ended, it
    queues that many steps of the next ``run`` for the rows still decoding before it copies the
    ended rows back and builds their results, so the device keeps stepping while the host turns
    results into text and admits new windows (the next ``run(n)`` runs ``n - run_ahead``). The
    gap it fills: on the H200 serving tiny.en the device idled while the engine thread did
    exactly that host work after each chunk (GPU busy 62-74%, README "Serving path").
    ``run_ahead=None`` paces the decoder: with CUDA graphs, each chunk's steps are timed with
    CUDA events (read once done, without waiting; a chunk that captured a graph is not), and the
    steps run ahead and the chunk the engine asks for (``chunk_steps``) follow the measured step
    time of the current batch bucket (``StepTimes``, ``decode_pace``; a bucket's first pace is
    logged at INFO, its changes at DEBUG); before a bucket is measured, and without CUDA graphs, it runs
    ``MAX_AHEAD_STEPS`` ahead and ``chunk_steps`` is None (the engine's default). A chunk the
    engine fixes itself leaves the steps run ahead paced.
    ``cross_fp8``: keep the cross-attention keys and values in FP8 (``KVCache``);
    ``cross_absorbed``: with it, one FP8 copy of the encoder's output instead (``KVCache``).
    """

    SPANS = (128, 256, 448)  # self-attention span buckets (positions); the last is the full context

    def __init__(self, model: Whisper, special: SpecialTokens, max_batch: int = 64, max_prompt: int = 228,
                 max_initial_timestamp_s: float = 1.0, use_cuda_graphs: bool | None = None,
                 compile_step: bool = False, run_ahead: int | None = 0, cross_fp8: bool = False,
                 cross_absorbed: bool = False) -> None:
        if run_ahead is not None and run_ahead < 0:
            raise ValueError(f"run_ahead is a number of decoder steps >= 0, got {run_ahead}")
        p = next(model.parameters())
        self.model, self.special, self.device, self.dtype = model, special, p.device, p.dtype
        self.dims = model.dims
        self.max_batch, self.max_prompt = max_batch, max_prompt
        self.max_initial_ts = round(max_initial_timestamp_s / 0.02)
        self.graphs_enabled = (self.device.type == "cuda") if use_cuda_graphs is None else use_cuda_graphs
        # one span when the self-attention kernel reads each row's own length (attention "triton")
        self.spans = (self.dims.max_target_positions,) if getattr(model, "attention", "sdpa") == "triton" else \
            (*tuple(s for s in self.SPANS if s < self.dims.max_target_positions), self.dims.max_target_positions)
        self.cache = KVCache(self.dims, max_batch, self.dtype, self.device, cross_fp8=cross_fp8,
                             cross_absorbed=cross_absorbed)
        d, b, t = self.device, max_batch, self.dims.max_target_positions
        v = self.dims.vocab_size
        long: dict[str, Any] = dict(dtype=torch.long, device=d)
        self.prompt = torch.zeros(b, max_prompt, **long)
        self.prompt_len = torch.ones(b, **long)
        self.sot_index = torch.zeros(b, **long)
        self.max_len = torch.full((b,), t, **long)
        self.min_new = torch.zeros(b, **long)
        self.timestamps = torch.zeros(b, dtype=torch.bool, device=d)
        self.tok = torch.zeros(b, **long)
        self.pos = torch.zeros(b, **long)
        self.hist = torch.zeros(b, t + 1, **long)
        self.done = torch.ones(b, dtype=torch.bool, device=d)
        self.ended = torch.zeros(b, dtype=torch.bool, device=d)
        self.sum_logprob = torch.zeros(b, dtype=torch.float32, device=d)
        self.no_speech = torch.zeros(b, dtype=torch.float32, device=d)
        self.last_ts = torch.full((b,), -1, **long)
        self.temperature = torch.zeros(b, dtype=torch.float32, device=d)
        ids = torch.arange(v, device=d)
        s = special
        self.is_ts = ids >= s.timestamp_begin
        self.is_text = ids < s.eot
        suppress = torch.zeros(v, dtype=torch.bool, device=d)
        suppress[[i for i in s.suppress if 0 <= i < v]] = True
        suppress |= (ids > s.eot) & ~self.is_ts  # special tokens other than end-of-text
        self.suppress = suppress
        self.blank_eot = torch.zeros(v, dtype=torch.bool, device=d)
        self.blank_eot[[s.blank, s.eot]] = True
        self.ids = ids
        self._graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self._compiled: Callable[..., Any] | None = None
        if compile_step and max_batch >= 2:
            # the function, not the bound method: the decoder would hold itself through it, and
            # ``del`` would not free its cache until the cyclic garbage collector ran
            self._compiled = compile_batch_dynamic(GreedyDecoder._rows_step, max_batch)
            # Compiled here, not on a request: one step of rows 0 and 1 (done, so the rules change
            # nothing an admission does not set again; the model writes their self-attention
            # cache at position 0, which an admission's first step overwrites) per span, under
            # the grad mode of every later call (another mode would be compiled again).
            with torch.inference_mode():
                for span in self.spans:
                    self._compiled(self, span, False, *(getattr(self, n)[:2] for n in _ROW_STATE))
        self._pool: Any = None  # a CUDA graph memory pool handle, shared by this decoder's graphs
        # Host bookkeeping of the slots: busy slot -> steps run since it was admitted (an upper
        # bound of its position, which picks the attention span), and the plen of each.
        self._busy: dict[int, int] = {}
        self._plen: dict[int, int] = {}
        self._sampling: set[int] = set()
        self._fixed_ahead = run_ahead
        self.step_times = StepTimes()
        self._paces: dict[int, tuple[int, int]] = {}  # the pace last logged per bucket
        # (start, end, bucket, steps) of timed chunks not yet read (paced, CUDA graphs only)
        self._timed: collections.deque[tuple[torch.cuda.Event, torch.cuda.Event, int, int]] = collections.deque()
        self._captured = False  # a graph was captured inside the chunk being timed (its time is not a step's)
        self._ahead = 0  # steps of the next run() that finished() has already queued

    @property
    def paced(self) -> bool:
        """Whether the steps run ahead and the chunk follow the measured step time."""
        return self._fixed_ahead is None

    def _current_pace(self) -> tuple[int, int] | None:
        if not self.paced or not self._busy:
            return None
        return self.step_times.pace_for(self.bucket(max(self._busy) + 1))

    @property
    def run_ahead(self) -> int:
        """Steps ``finished`` queues for the rows still decoding (see the class)."""
        if self._fixed_ahead is not None:
            return self._fixed_ahead
        p = self._current_pace()
        return MAX_AHEAD_STEPS if p is None else p[1]

    @property
    def chunk_steps(self) -> int | None:
        """The decode chunk the measured step time asks for (``decode_pace``), or None when
        not paced or not yet measured for the current batch bucket."""
        p = self._current_pace()
        return None if p is None else p[0]

    @property
    def compiled(self) -> bool:
        """Whether the step runs through ``torch.compile`` (``compile_step``)."""
        return self._compiled is not None

    @staticmethod
    def compiles_step_for(model: Whisper, device: torch.device) -> bool:
        """The backend's default for ``compile_step``: on for the CUDA models whose encoder is
        compiled (``CompiledEncoder.enabled_for``: medium and the large family) when the step's
        attention is Triton's (the default with FP8 keys and values); off otherwise.

        Why the whole step: Inductor fuses each residual add into the next layer norm and the
        rest of a layer's elementwise work, and the logit rules' passes over ``[B, vocab]`` (masks,
        log-sum-exps, maxima, argmax) into few kernels. Measured at large-v3 size, batch 64 (random
        weights, FP8 keys and values, CUDA graphs; ``bench/gpu_autotune.py`` as it was at a5eda9c,
        one H100 run, ``bench/results/gpu_step_compile_h100.json``), the whole step compiled for a
        static batch of 64: 5.44 ms a step against 5.82 with the model's step alone compiled
        (-6.5%); at tiny size 0.80 against 1.03 ms with the step eager (-22%). Tiny stays off: its
        engine alone ran 10,405 audio-s/s against 8,159 eager (real weights, batch 64, H100), but
        served at 256 clients, taking turns, 7,267 and 6,693 against 7,289 and 6,559 (its serving
        is bound by the host; ``bench/results/gpu_fp8_products_h100.json``). As shipped (batch dimension
        dynamic), large-v3's engine alone at batch 64 ran 964 audio-s/s against 886 with the step
        eager, side by side (+8.7%; the model's step alone compiled had given +3.7%), and served
        949 (H100, 2,000 requests, ``bench/results/gpu_e2e_large_v3_h100_step_rules.json``); its step
        5.46 ms at batch 64 (``bench/gpu_autotune.py --variants whole``). With
        PyTorch's attention the cache scatters under Inductor are checked on the CPU (tests) and at
        tiny size on an H100 only (long files WER 0.000 as eager); by default it is off with that attention."""
        return CompiledEncoder.enabled_for(model, device) and model.attention == "triton"

    # --- the step: static shapes, in-place state, no host sync ---------------------------------

    def _step(self, b: int, span: int, sampling: bool = False) -> None:
        """One step of rows ``[:b]``: compiled (``compile_step``) for 2 or more rows without
        sampling, eager otherwise (one row would be specialised and compiled again; sampling is
        rare, Whisper's fallback)."""
        rows = tuple(getattr(self, n)[:b] for n in _ROW_STATE)
        if self._compiled is not None and b >= 2 and not sampling:
            self._compiled(self, span, False, *rows)
        else:
            self._rows_step(span, sampling, *rows)

    def _rows_step(self, span: int, sampling: bool, tok: torch.Tensor, pos: torch.Tensor, plen: torch.Tensor,
                   sot_index: torch.Tensor, max_len: torch.Tensor, min_new: torch.Tensor, timestamps: torch.Tensor,
                   prompt: torch.Tensor, temperature: torch.Tensor, hist: torch.Tensor, done: torch.Tensor,
                   ended: torch.Tensor, sum_logprob: torch.Tensor, no_speech: torch.Tensor,
                   last_ts: torch.Tensor) -> None:
        """The step over the state's first B rows (``_ROW_STATE``, each ``[B, ...]``), updated in
        place: the model's step, the logit rules (the module doc), the chosen token."""
        s = self.special
        b = tok.shape[0]
        logits = self.model.step(self.cache, tok, pos, span)  # [b, V], predicts position pos + 1
        # p(no speech) = exp(logit - logsumexp(logits)): one reduction, no [B, V] log-softmax.
        raw_ns = logits[:, s.no_speech] - torch.logsumexp(logits, dim=-1)
        no_speech.copy_(torch.where(pos == sot_index, raw_ns.exp(), no_speech))

        n_gen = pos + 1 - plen  # tokens already sampled before the one chosen now
        mask = self.suppress[None, :].expand(b, -1)
        first = (n_gen == 0)[:, None]
        mask = mask | (first & self.blank_eot[None, :])
        mask = mask | ((n_gen < min_new)[:, None] & (self.ids == s.eot)[None, :])
        ts_on = timestamps[:, None]
        mask = mask | (~ts_on & self.is_ts[None, :])
        # Timestamp rules (rows with timestamps on).
        prev = hist.gather(1, (pos - 1).clamp(min=0)[:, None])[:, 0]
        after_ts = (n_gen >= 1) & (tok >= s.timestamp_begin)
        pen_ts = (n_gen < 2) | (prev >= s.timestamp_begin)
        rule = torch.zeros_like(mask)
        rule |= (after_ts & pen_ts)[:, None] & self.is_ts[None, :]
        rule |= (after_ts & ~pen_ts)[:, None] & self.is_text[None, :]
        floor = torch.where(after_ts & ~pen_ts, last_ts, last_ts + 1)
        rule |= ((last_ts >= 0)[:, None] & self.is_ts[None, :] & (self.ids[None, :] < floor[:, None]))
        rule |= first & ~self.is_ts[None, :]
        rule |= first & (self.ids[None, :] > s.timestamp_begin + self.max_initial_ts)
        mask = mask | (ts_on & rule)
        filtered = logits.masked_fill(mask, _NEG_INF)
        # Timestamps' total probability vs the best text token's: both log-probabilities share the
        # same normaliser, so compare the filtered logits directly.
        ts_mass = torch.logsumexp(filtered.masked_fill(~self.is_ts[None, :], _NEG_INF), dim=-1)
        best_text = filtered.masked_fill(self.is_ts[None, :], _NEG_INF).max(dim=-1).values
        force_ts = ts_on[:, 0] & (ts_mass > best_text)
        filtered = filtered.masked_fill(force_ts[:, None] & ~self.is_ts[None, :], _NEG_INF)
        if sampling:  # rows with T > 0 draw from softmax(filtered / T) (Gumbel-max); T == 0 rows take argmax
            u = torch.rand_like(filtered).clamp_(min=1e-20, max=1.0 - 1e-7)
            noisy = filtered / temperature.clamp(min=1e-6)[:, None] - torch.log(-torch.log(u))
            sample = torch.where(temperature > 0, noisy.argmax(dim=-1), filtered.argmax(dim=-1))
        else:
            sample = filtered.argmax(dim=-1)
        sample_lp = filtered.gather(1, sample[:, None])[:, 0] - torch.logsumexp(filtered, dim=-1)

        in_prompt = pos + 1 < plen
        active = ~done & ~in_prompt
        forced = prompt.gather(1, (pos + 1).clamp(max=self.max_prompt - 1)[:, None])[:, 0]
        nxt = torch.where(in_prompt, forced, sample)
        nxt = torch.where(done, tok, nxt)
        hist.scatter_(1, (pos + 1)[:, None], nxt[:, None])
        sum_logprob += torch.where(active & (sample != s.eot), sample_lp, 0.0)
        last_ts.copy_(torch.where(active & (sample >= s.timestamp_begin), sample, last_ts))
        hit_eot = active & (sample == s.eot)
        ended |= hit_eot
        new_done = done | hit_eot | (pos + 2 >= max_len)
        pos.copy_(torch.where(done, pos, pos + 1))
        tok.copy_(nxt)
        done.copy_(new_done)

    def _run_step(self, b: int, span: int, sampling: bool = False) -> None:
        if not self.graphs_enabled:
            self._step(b, span, sampling)
            return
        key = (b, span, sampling)
        graph = self._graphs.get(key)
        if graph is None:
            saved = {n: getattr(self, n).clone() for n in _STATE}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up before capture (allocations, autotuning, compilation)
                    self._step(b, span, sampling)
            torch.cuda.current_stream().wait_stream(side)
            for n, v in saved.items():  # the warm-up must not change the batch's state
                getattr(self, n).copy_(v)
            graph = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._pool):
                self._step(b, span, sampling)
            for n, v in saved.items():
                getattr(self, n).copy_(v)
            self._graphs[key] = graph
            self._captured = True
        graph.replay()

    @torch.inference_mode()
    def capture_all(self) -> int:
        """Capture the step's CUDA graph for every (batch bucket, span) now, so that no request
        pays a capture later (each costs a few steps). Rows are marked done, so the captured
        steps change nothing. Returns the number of graphs captured (0 without CUDA graphs)."""
        if not self.graphs_enabled:
            return 0
        self.done.fill_(True)
        before = len(self._graphs)
        b = 1
        while True:
            for span in self.spans:
                self._run_step(min(b, self.max_batch), span)
            if b >= self.max_batch:
                break
            b *= 2
        torch.cuda.synchronize()
        return len(self._graphs) - before

    # --- slots: continuous batching -------------------------------------------------------

    def bucket(self, n: int) -> int:
        """The padded batch size for n rows: a power of two up to max_batch (few graphs)."""
        return pow2_bucket(n, self.max_batch)

    @property
    def free_slots(self) -> int:
        """Slots that can take a new row now."""
        return self.max_batch - len(self._busy)

    @property
    def busy_slots(self) -> tuple[int, ...]:
        return tuple(sorted(self._busy))

    @torch.inference_mode()
    def admit(self, encoded: torch.Tensor, prompts: list[list[int]], timestamps: list[bool],
              max_new_tokens: list[int | None] | int | None = None, temperatures: list[float] | None = None,
              min_new_tokens: int = 0) -> list[int]:
        """Put ``len(prompts)`` new rows into the lowest free slots; return their slot numbers.

        ``encoded`` ``[n, 1500, d_model]`` is each row's encoder output; each prompt must hold
        ``<|startoftranscript|>`` and at most ``max_prompt`` tokens; ``max_new_tokens`` caps the
        sampled tokens per row (None: up to the 448-token context); ``temperatures`` (default 0)
        picks greedy (0) or sampling (> 0) per row. Raises ValueError for an empty list, more
        rows than free slots, or a bad prompt.
        """
        n = len(prompts)
        if not 0 < n <= self.free_slots or encoded.shape[0] != n:
            raise ValueError(f"admit takes 1..{self.free_slots} rows (free slots) and one encoder output each; "
                             f"got {n} prompts, {encoded.shape[0]} outputs")
        t = self.dims.max_target_positions
        caps = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
        temps = [0.0] * n if temperatures is None else [float(x) for x in temperatures]
        host = torch.zeros(n, self.max_prompt, dtype=torch.long)  # filled here, copied to the device once
        plens, sots = [], []
        for i, p in enumerate(prompts):
            if not p or len(p) > self.max_prompt or self.special.sot not in p:
                raise ValueError(f"prompt {i} has {len(p)} tokens; it needs <|startoftranscript|> and at most {self.max_prompt}")
            host[i, : len(p)] = torch.tensor(p, dtype=torch.long)
            plens.append(len(p))
            sots.append(p.index(self.special.sot))
        free = [s for s in range(self.max_batch) if s not in self._busy][:n]
        idx = _to_device(torch.tensor(free, dtype=torch.long), self.device)
        prompt_dev = _to_device(host, self.device)
        self.model.fill_cross(self.cache, encoded.to(self.dtype), rows=idx)
        self.prompt.index_copy_(0, idx, prompt_dev)
        self.prompt_len.index_copy_(0, idx, _to_device(torch.tensor(plens, dtype=torch.long), self.device))
        self.sot_index.index_copy_(0, idx, _to_device(torch.tensor(sots, dtype=torch.long), self.device))
        limits = [t if c is None else min(pl + c, t) for pl, c in zip(plens, caps, strict=True)]
        self.max_len.index_copy_(0, idx, _to_device(torch.tensor(limits, dtype=torch.long), self.device))
        self.min_new.index_fill_(0, idx, min_new_tokens)
        self.timestamps.index_copy_(0, idx, _to_device(torch.tensor(list(timestamps), dtype=torch.bool), self.device))
        self.temperature.index_copy_(0, idx, _to_device(torch.tensor(temps, dtype=torch.float32), self.device))
        first = prompt_dev[:, 0]
        self.tok.index_copy_(0, idx, first)
        self.pos.index_fill_(0, idx, 0)
        hist = torch.zeros(n, t + 1, dtype=torch.long, device=self.device)
        hist[:, 0] = first
        self.hist.index_copy_(0, idx, hist)
        self.done.index_fill_(0, idx, False)
        self.ended.index_fill_(0, idx, False)
        self.sum_logprob.index_fill_(0, idx, 0.0)
        self.no_speech.index_fill_(0, idx, 0.0)
        self.last_ts.index_fill_(0, idx, -1)
        for s, pl, temp in zip(free, plens, temps, strict=True):
            self._busy[s] = 0
            self._plen[s] = pl
            if temp > 0:
                self._sampling.add(s)
        return free

    @torch.inference_mode()  # the engine loop calls it outside: no autograd history across steps
    def run(self, steps: int) -> None:
        """Run ``steps`` decoder steps over the busy slots (no host sync), less the steps the
        last ``finished`` ran ahead. Does nothing when no slot is busy. When the pace changed in
        between (a bucket measured for the first time, or admissions that moved the bucket),
        the round runs the larger of the two; rows admitted since then may wait for the next
        round's steps ahead."""
        ahead, self._ahead = self._ahead, 0
        steps -= ahead
        if not self._busy or steps <= 0:
            return
        self._steps(steps)

    def _steps(self, steps: int) -> None:
        t = self.dims.max_target_positions
        b = self.bucket(max(self._busy) + 1)
        sampling = bool(self._sampling)
        timed = self.paced and self.graphs_enabled
        if timed:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._captured = False
        for _ in range(steps):
            longest = max(self._busy.values())
            span = next(s for s in self.spans if s >= min(longest + 2, t))
            self._run_step(b, span, sampling)
            for s in self._busy:
                self._busy[s] += 1
        if timed and not self._captured:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._timed.append((start, end, b, steps))

    def _read_timings(self) -> None:
        """Feed the chunks whose timing events the device has passed to ``step_times``; log a
        bucket's first pace at INFO and its later changes at DEBUG (a step time near a boundary
        of ``decode_pace`` may flip it from one round to the next)."""
        while self._timed and self._timed[0][1].query():
            start, end, b, n = self._timed.popleft()
            self.step_times.observe(b, n, start.elapsed_time(end) / 1000.0)
            pace = self.step_times.pace_for(b)
            if pace is not None and self._paces.get(b) != pace:
                log.log(logging.DEBUG if b in self._paces else logging.INFO,
                        "decode pace for %d rows: %.2f ms a step -> chunks of %d steps, %d run ahead",
                        b, self.step_times.step_s[b] * 1e3, *pace)
                self._paces[b] = pace

    @torch.inference_mode()
    def finished(self) -> list[tuple[int, RowResult]]:
        """Rows that have ended (end-of-text or their token limit), with their results; their
        slots are free again. One device-to-host copy of the done flags (the only wait for the
        device), then one per state tensor for the finished rows only, queued before the
        ``run_ahead`` steps (see the class) so that reading them waits for no step."""
        if not self._busy:
            return []
        b = self.bucket(max(self._busy) + 1)
        done = self.done[:b].cpu().tolist()
        self._read_timings()  # after that wait, every chunk queued before it has its times
        slots = [s for s in sorted(self._busy) if done[s]]
        plens = [self._plen.pop(s) for s in slots]
        for s in slots:
            del self._busy[s]
            self._sampling.discard(s)
        if not slots:
            self._queue_ahead()
            return []
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        cuda = self.device.type == "cuda"
        copies = []
        for name in ("hist", "pos", "ended", "sum_logprob", "no_speech"):
            rows = getattr(self, name).index_select(0, idx)  # ended rows never change again: safe to read later
            if cuda:
                host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
                host.copy_(rows, non_blocking=True)
                rows = host
            copies.append(rows)
        copied = None
        if cuda:
            copied = torch.cuda.Event()
            copied.record()
        self._queue_ahead()
        if copied is not None:
            copied.synchronize()
        hist, pos, ended, logprob, no_speech = (c.tolist() for c in copies)
        out = []
        for k, s in enumerate(slots):
            toks = hist[k][plens[k]: pos[k] + 1]
            if ended[k] and toks and toks[-1] == self.special.eot:
                toks = toks[:-1]
            out.append((s, RowResult(tokens=toks, sum_logprob=logprob[k], no_speech_prob=no_speech[k], ended=ended[k])))
        return out

    def _queue_ahead(self) -> None:
        ahead = self.run_ahead
        if ahead and self._busy and not self._ahead:
            self._steps(ahead)
            self._ahead = ahead

    def release(self, slots: list[int]) -> None:
        """Stop the rows in ``slots`` now (their caller went away); the slots are free again."""
        slots = [s for s in slots if s in self._busy]
        if not slots:
            return
        self.done.index_fill_(0, _to_device(torch.tensor(slots, dtype=torch.long), self.device), True)
        for s in slots:
            del self._busy[s]
            self._plen.pop(s, None)
            self._sampling.discard(s)

    # --- one static batch -------------------------------------------------------------------

    @torch.inference_mode()
    def decode(self, encoded: torch.Tensor, prompts: list[list[int]], timestamps: list[bool],
               max_new_tokens: int | None = None, min_new_tokens: int = 0, check_every: int = 4,
               temperatures: list[float] | None = None) -> list[RowResult]:
        """Decode ``len(prompts)`` rows over ``encoded`` ``[n, 1500, d_model]`` to completion.

        The rows are admitted together into an idle decoder and run until every row has ended;
        see ``admit`` for the arguments. Raises ValueError for an empty batch, more rows than
        ``max_batch``, a busy decoder or a bad prompt.
        """
        n = len(prompts)
        if self._busy:
            raise ValueError("decode() needs an idle decoder; use admit/run/finished alongside other rows")
        if not 0 < n <= self.max_batch or encoded.shape[0] != n:
            raise ValueError(f"a batch has 1..{self.max_batch} rows and one encoder output each; got {n} prompts, "
                             f"{encoded.shape[0]} outputs")
        slots = self.admit(encoded, prompts, timestamps, max_new_tokens, temperatures, min_new_tokens)
        results: dict[int, RowResult] = {}
        while self._busy:
            self.run(check_every)
            results.update(self.finished())
        return [results[s] for s in slots]


_STATE = ("tok", "pos", "hist", "done", "ended", "sum_logprob", "no_speech", "last_ts")
#: The per-row tensors a step reads and writes, in ``GreedyDecoder._rows_step``'s order.
_ROW_STATE = ("tok", "pos", "prompt_len", "sot_index", "max_len", "min_new", "timestamps", "prompt", "temperature",
              "hist", "done", "ended", "sum_logprob", "no_speech", "last_ts")
