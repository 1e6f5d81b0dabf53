"""Batched greedy decoding for Whisper over a static KV cache, one CUDA graph per step.

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
Source: Radford et al. 2022 (Whisper), section 4.5 and its reference decoder.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tideserve.worker.backends.torch_whisper.model import KVCache, Whisper

_NEG_INF = float("-inf")


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
    bucket on first use. ``compile_step`` runs the step through ``torch.compile`` first (fusing
    its many small kernels; costs a compilation per bucket, tens of seconds at large-v3 size). ``max_prompt`` bounds prompt length in tokens (Whisper: at most half
    the 448-token context is previous text).
    """

    SPANS = (128, 256, 448)  # self-attention span buckets (positions); the last is the full context

    def __init__(self, model: Whisper, special: SpecialTokens, max_batch: int = 64, max_prompt: int = 228,
                 max_initial_timestamp_s: float = 1.0, use_cuda_graphs: bool | None = None,
                 compile_step: bool = False) -> None:
        p = next(model.parameters())
        self.model, self.special, self.device, self.dtype = model, special, p.device, p.dtype
        self.dims = model.dims
        self.max_batch, self.max_prompt = max_batch, max_prompt
        self.max_initial_ts = int(round(max_initial_timestamp_s / 0.02))
        self.graphs_enabled = (self.device.type == "cuda") if use_cuda_graphs is None else use_cuda_graphs
        self.spans = tuple(s for s in self.SPANS if s < self.dims.max_target_positions) + (self.dims.max_target_positions,)
        self.cache = KVCache(self.dims, max_batch, self.dtype, self.device)
        d, b, t = self.device, max_batch, self.dims.max_target_positions
        v = self.dims.vocab_size
        long = dict(dtype=torch.long, device=d)
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
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._step_fn = torch.compile(self._step, dynamic=False) if compile_step else self._step
        self._pool = None

    # --- the step: static shapes, in-place state, no host sync ---------------------------------

    def _step(self, b: int, span: int) -> None:
        s = self.special
        tok, pos, plen = self.tok[:b], self.pos[:b], self.prompt_len[:b]
        done, hist = self.done[:b], self.hist[:b]
        logits = self.model.step(self.cache, tok, pos, span)  # [b, V], predicts position pos + 1
        # p(no speech) = exp(logit - logsumexp(logits)): one reduction, no [B, V] log-softmax.
        raw_ns = logits[:, s.no_speech] - torch.logsumexp(logits, dim=-1)
        at_sot = pos == self.sot_index[:b]
        self.no_speech[:b] = torch.where(at_sot, raw_ns.exp(), self.no_speech[:b])

        n_gen = pos + 1 - plen  # tokens already sampled before the one chosen now
        mask = self.suppress[None, :].expand(b, -1)
        first = (n_gen == 0)[:, None]
        mask = mask | (first & self.blank_eot[None, :])
        mask = mask | ((n_gen < self.min_new[:b])[:, None] & (self.ids == s.eot)[None, :])
        ts_on = self.timestamps[:b][:, None]
        mask = mask | (~ts_on & self.is_ts[None, :])
        # Timestamp rules (rows with timestamps on).
        prev = hist.gather(1, (pos - 1).clamp(min=0)[:, None])[:, 0]
        last_ts = (n_gen >= 1) & (tok >= s.timestamp_begin)
        pen_ts = (n_gen < 2) | (prev >= s.timestamp_begin)
        rule = torch.zeros_like(mask)
        rule |= (last_ts & pen_ts)[:, None] & self.is_ts[None, :]
        rule |= (last_ts & ~pen_ts)[:, None] & self.is_text[None, :]
        floor = torch.where(last_ts & ~pen_ts, self.last_ts[:b], self.last_ts[:b] + 1)
        rule |= ((self.last_ts[:b] >= 0)[:, None] & self.is_ts[None, :] & (self.ids[None, :] < floor[:, None]))
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
        sample = filtered.argmax(dim=-1)
        sample_lp = filtered.gather(1, sample[:, None])[:, 0] - torch.logsumexp(filtered, dim=-1)

        in_prompt = pos + 1 < plen
        active = ~done & ~in_prompt
        forced = self.prompt[:b].gather(1, (pos + 1).clamp(max=self.max_prompt - 1)[:, None])[:, 0]
        nxt = torch.where(in_prompt, forced, sample)
        nxt = torch.where(done, tok, nxt)
        hist.scatter_(1, (pos + 1)[:, None], nxt[:, None])
        self.sum_logprob[:b] += torch.where(active & (sample != s.eot), sample_lp, 0.0)
        self.last_ts[:b] = torch.where(active & (sample >= s.timestamp_begin), sample, self.last_ts[:b])
        hit_eot = active & (sample == s.eot)
        self.ended[:b] |= hit_eot
        new_done = done | hit_eot | (pos + 2 >= self.max_len[:b])
        self.pos[:b] = torch.where(done, pos, pos + 1)
        self.tok[:b] = nxt
        self.done[:b] = new_done

    def _run_step(self, b: int, span: int) -> None:
        if not self.graphs_enabled:
            self._step_fn(b, span)
            return
        key = (b, span)
        graph = self._graphs.get(key)
        if graph is None:
            saved = {n: getattr(self, n).clone() for n in _STATE}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up before capture (allocations, autotuning, compilation)
                    self._step_fn(b, span)
            torch.cuda.current_stream().wait_stream(side)
            for n, v in saved.items():  # the warm-up must not change the batch's state
                getattr(self, n).copy_(v)
            graph = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._pool):
                self._step_fn(b, span)
            for n, v in saved.items():
                getattr(self, n).copy_(v)
            self._graphs[key] = graph
        graph.replay()

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

    # --- a batch --------------------------------------------------------------------------

    def bucket(self, n: int) -> int:
        """The padded batch size for n rows: a power of two up to max_batch (few graphs)."""
        b = 1
        while b < n:
            b *= 2
        return min(b, self.max_batch)

    @torch.inference_mode()
    def decode(self, encoded: torch.Tensor, prompts: list[list[int]], timestamps: list[bool],
               max_new_tokens: int | None = None, min_new_tokens: int = 0, check_every: int = 4) -> list[RowResult]:
        """Greedy-decode ``len(prompts)`` rows over ``encoded`` ``[n, 1500, d_model]``.

        Each prompt must contain ``<|startoftranscript|>``; at most ``max_new_tokens`` (default:
        up to the 448-token context) are sampled per row. Raises ValueError for an empty batch,
        more rows than ``max_batch`` or a prompt longer than ``max_prompt``.
        """
        n = len(prompts)
        if not 0 < n <= self.max_batch or encoded.shape[0] != n:
            raise ValueError(f"a batch has 1..{self.max_batch} rows and one encoder output each; got {n} prompts, "
                             f"{encoded.shape[0]} outputs")
        t = self.dims.max_target_positions
        b = self.bucket(n)
        self.model.fill_cross(self.cache, encoded.to(self.dtype))
        host = torch.zeros(b, self.max_prompt, dtype=torch.long)  # filled here, copied to the device once
        plens = []
        for i, p in enumerate(prompts):
            if not p or len(p) > self.max_prompt or self.special.sot not in p:
                raise ValueError(f"prompt {i} has {len(p)} tokens; it needs <|startoftranscript|> and at most {self.max_prompt}")
            host[i, : len(p)] = torch.tensor(p, dtype=torch.long)
            plens.append(len(p))
        plens += [1] * (b - n)
        self.prompt[:b].copy_(host)
        dev = self.device
        plen = torch.tensor(plens, dtype=torch.long, device=dev)
        self.prompt_len[:b] = plen
        self.sot_index[:b] = torch.tensor([p.index(self.special.sot) for p in prompts] + [0] * (b - n), device=dev)
        limit = t if max_new_tokens is None else torch.clamp(plen + max_new_tokens, max=t)
        self.max_len[:b] = limit
        self.min_new[:b] = min_new_tokens
        self.timestamps[:b] = torch.tensor(list(timestamps) + [False] * (b - n), device=dev)
        self.tok[:b] = self.prompt[:b, 0]
        self.pos[:b] = 0
        self.hist[:b].zero_()
        self.hist[:b, 0] = self.prompt[:b, 0]
        self.done[:b] = torch.arange(b, device=dev) >= n  # padding rows are done from the start
        self.ended[:b] = False
        self.sum_logprob[:b] = 0
        self.no_speech[:b] = 0
        self.last_ts[:b] = -1
        longest = max(plens) + (t if max_new_tokens is None else max_new_tokens)
        steps = min(longest, t - 1)
        for i in range(steps):
            span = next(s for s in self.spans if s >= min(i + 2, t))
            self._run_step(b, span)
            if (i + 1) % check_every == 0 and bool(self.done[:b].all()):
                break
        # One device-to-host copy per state tensor, not one per row.
        hist, pos, ended, logprob, no_speech = (getattr(self, name)[:n].cpu().tolist() for name in
                                                 ("hist", "pos", "ended", "sum_logprob", "no_speech"))
        out = []
        for i in range(n):
            toks = hist[i][plens[i]: pos[i] + 1]
            if ended[i] and toks and toks[-1] == self.special.eot:
                toks = toks[:-1]
            out.append(RowResult(tokens=toks, sum_logprob=logprob[i], no_speech_prob=no_speech[i], ended=ended[i]))
        return out


_STATE = ("tok", "pos", "hist", "done", "ended", "sum_logprob", "no_speech", "last_ts")
