"""Spoken-language identification on PyTorch beside an English-only model (``model.language_id``
with the torch backend; the faster-whisper backend has its own on CTranslate2).

Whisper's rule (Radford et al. 2022, section 2.3; openai/whisper ``detect_language``): encode the
audio, put ``<|startoftranscript|>`` at the decoder's first position, and read the softmax of the
logits over the language tokens only. As the faster-whisper identifier does, the encoder sees
``seconds`` of each window from where its sound starts (``worker.language_id.speech_start``),
zero-padded to ``seconds`` (a shorter encoding than Whisper's 30 s; always that length, so that
a window's verdict does not depend on the windows beside it). On a GPU the whole pass (encoder,
first decoder position, softmax) is replayed from one CUDA graph per batch bucket
(``GraphedEncoder``): launched kernel by kernel it cost the engine loop more host time than the
GPU time it took (README, Languages).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from tideserve.errors import EngineMismatchError
from tideserve.worker.backends.torch_whisper.features import HOP, N_FRAMES, LogMel
from tideserve.worker.backends.torch_whisper.model import GraphedEncoder, Whisper, load_hf_dir
from tideserve.worker.language_id import speech_start

#: Whisper's multilingual vocabularies have 51,865 (v1/v2) or 51,866 (v3) tokens; English-only 51,864.
MULTILINGUAL_VOCAB = 51_865
MIN_FRAMES = 100  # 1 s of 10 ms frames


def language_tokens(tok: Tokenizer) -> dict[str, int]:
    """``{language code: token id}`` of a Whisper tokenizer's language tokens (``<|fr|>``...;
    {} for an English-only one, which has none)."""
    out = {}
    for name, i in tok.get_vocab().items():
        if name.startswith("<|") and name.endswith("|>") and 2 <= len(name) - 4 <= 3 and name[2:-2].isalpha():
            out[name[2:-2]] = i
    return out


@dataclass(frozen=True)
class Heard:
    """Language probabilities of one call (``LanguageIdentifier.probabilities``): on the host
    (page-locked) once ``copied`` (a CUDA event; None on the CPU) has completed."""

    host: torch.Tensor
    copied: Any


class LanguageIdentifier:
    """A multilingual Whisper model (``model_dir``: Hugging Face or CTranslate2 format, with its
    ``tokenizer.json``) on ``device`` in ``dtype`` that hears which language a window is in.

    ``languages``: the transcribing model's languages, whose probabilities are summed
    (``worker.language_id.other_language`` compares that sum with the minimum).
    Raises EngineMismatchError when the directory cannot be loaded or is an English-only model."""

    def __init__(self, model_dir: Path, dtype: torch.dtype, device: torch.device, seconds: float,
                 languages: frozenset[str], max_batch: int = 64, graphs: bool | None = None) -> None:
        try:
            tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
            self.model: Whisper = load_hf_dir(Path(model_dir), dtype, device)
        except Exception as exc:  # tokenizers raises its own Exception type; load_hf_dir ValueError/OSError
            raise EngineMismatchError(f"cannot load the language-ID model {model_dir}: {exc}") from None
        codes = language_tokens(tok)
        if self.model.dims.vocab_size < MULTILINGUAL_VOCAB or not codes:
            raise EngineMismatchError(f"the language-ID model {model_dir} is English-only; model.language_id.source "
                                      "must be a multilingual Whisper model (e.g. Whisper base)")
        sot = tok.token_to_id("<|startoftranscript|>")
        if sot is None:
            raise EngineMismatchError(f"the language-ID model {model_dir} has no <|startoftranscript|> token")
        self._sot = sot
        self.codes = sorted(codes)
        self._ids = torch.tensor([codes[c] for c in self.codes], device=device)
        self._ours = torch.tensor([c in languages for c in self.codes])
        self._dtype = dtype
        self._features = LogMel(self.model.dims.num_mel_bins, device)
        self._max_frames = min(N_FRAMES, max(MIN_FRAMES, round(seconds * 100)))
        # graphs: None = on a GPU (tests may turn them off, or on for a GPU check)
        self._graph = GraphedEncoder(self.model, max_batch, self._pass) \
            if (device.type == "cuda" if graphs is None else graphs and device.type == "cuda") else None

    def _pass(self, feats: torch.Tensor) -> torch.Tensor:
        """``[B, n_mels, frames]`` features -> ``[B, len(codes)]`` language probabilities."""
        logits = self.model.first_position_logits(self.model.encode(feats), self._sot)
        return torch.softmax(logits[:, self._ids], dim=-1)

    @torch.inference_mode()
    def probabilities(self, windows: list[np.ndarray]) -> Heard:
        """The windows' language probabilities (``[B, len(codes)]``, rows sum to 1), queued on the
        device with their copy to the host; ``read`` gives one row's answer. Nothing here waits
        for the device (the engine queues decode steps ahead of the host: a wait here, or a
        ``.cpu()`` later, would drain them; on the H200 reading each row with ``.cpu()`` served
        0.67x the audio-seconds without identification, at 46% GPU busy instead of 81%)."""
        n = self._max_frames
        feats = self._features([w[s: s + n * HOP] for w in windows for s in (speech_start(w),)])[..., :n]
        feats = feats.to(self._dtype)
        # with graphs: the bucket's output buffer, valid until the next call (copied out below)
        probabilities = self._pass(feats) if self._graph is None else self._graph(feats.contiguous())
        if probabilities.device.type != "cuda":
            return Heard(probabilities, None)
        host = torch.empty(probabilities.shape, dtype=probabilities.dtype, pin_memory=True)
        host.copy_(probabilities, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return Heard(host, done)

    def read(self, heard: Heard, row: int) -> tuple[str, float, float]:
        """``(most probable language, its probability, the transcribing model's languages'
        probability together)`` of row ``row`` of ``heard``; waits only for that copy."""
        if heard.copied is not None:
            heard.copied.synchronize()
        p = heard.host[row].float()
        best = int(p.argmax())
        return self.codes[best], float(p[best]), float(p[self._ours].sum())
