"""Whisper in plain PyTorch, laid out for serving: a batched encoder and a one-token decoder
step over a static KV cache, so the step can be captured once as a CUDA graph and replayed.

Architecture: Radford et al., "Robust Speech Recognition via Large-Scale Weak Supervision"
(2022): two strided 1-D convolutions (GELU) over the log-mel input, sinusoidal positions, pre-
norm Transformer encoder; a Transformer decoder with learned positions, self-attention over the
tokens so far and cross-attention over the 1500 encoder positions; output projection tied to
the token embedding. Parameter names follow the Hugging Face ``WhisperForConditionalGeneration``
layout (``model.encoder.layers.0.self_attn.q_proj.weight`` …) so a Hugging Face-format
directory loads as is; ``k_proj`` has no bias (as in Whisper).

Shapes: features ``[B, n_mels, 3000]`` -> encoder states ``[B, 1500, d_model]``; decoder step:
tokens ``[B]``, positions ``[B]`` -> logits ``[B, vocab]``. Caches: self-attention K/V
``[B, heads, max_target_positions, head_dim]`` per layer, cross-attention K/V
``[B, heads, 1500, head_dim]`` per layer, all preallocated for the largest batch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, cast
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class WhisperDims:
    """Model sizes, read from a Hugging Face ``config.json`` (same key names)."""

    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_layers: int = 4
    decoder_attention_heads: int = 6
    decoder_ffn_dim: int = 1536
    vocab_size: int = 51864
    max_source_positions: int = 1500
    max_target_positions: int = 448

    @classmethod
    def from_config(cls, config: dict) -> WhisperDims:
        """Raises ValueError naming a missing key."""
        try:
            return cls(**{k: int(config[k]) for k in cls.__dataclass_fields__})
        except KeyError as exc:
            raise ValueError(f"config.json lacks {exc.args[0]!r}, which a Whisper model config has") from None

    @classmethod
    def tiny(cls) -> WhisperDims:
        """tiny / tiny.en sizes (39 M parameters)."""
        return cls()

    @classmethod
    def large_v3(cls) -> WhisperDims:
        """large-v3 sizes (1.55 B parameters; 128 mel bins, 51866 tokens)."""
        return cls(num_mel_bins=128, d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                   decoder_layers=32, decoder_attention_heads=20, decoder_ffn_dim=5120, vocab_size=51866)


def sinusoids(length: int, channels: int, max_timescale: float = 10_000.0) -> torch.Tensor:
    """Whisper's encoder positions ``[length, channels]``: sin on the first half, cos on the second."""
    log_inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-log_inc * torch.arange(channels // 2, dtype=torch.float32))
    t = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.qkv_proj: nn.Module | None = None  # set by fuse_qkv

    def fuse_qkv(self) -> None:
        """Concatenate the q, k and v projections into one ``qkv_proj`` (``[3 * d_model, d_model]``
        weight and ``[3 * d_model]`` bias; k has none: zeros) for one matrix product per step, and
        make the projections' weights and biases views into it (no second copy; loading weights in
        place, e.g. ``load_state_dict``, updates both). Call it after the model's last ``.to()``: a
        dtype or device change converts ``qkv_proj`` and the projections separately, and they no
        longer share storage. After it ``state_dict()`` and ``parameters()`` hold ``qkv_proj`` too
        (the same storage as q, k and v), so loading an unfused state dict needs ``strict=False``."""
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]).detach()
        bias = torch.cat([self.q_proj.bias, torch.zeros_like(self.q_proj.bias), self.v_proj.bias]).detach()
        d = self.q_proj.weight.shape[0]
        for i, proj in enumerate((self.q_proj, self.k_proj, self.v_proj)):
            proj.weight = nn.Parameter(w[i * d:(i + 1) * d], requires_grad=False)
        self.q_proj.bias = nn.Parameter(bias[:d], requires_grad=False)
        self.v_proj.bias = nn.Parameter(bias[2 * d:], requires_grad=False)
        with torch.device("meta"):
            self.qkv_proj = nn.Linear(w.shape[1], w.shape[0])
        self.qkv_proj.weight = nn.Parameter(w, requires_grad=False)
        self.qkv_proj.bias = nn.Parameter(bias, requires_grad=False)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b, t, h * d)


@torch.library.custom_op("tideserve::linear_gelu", mutates_args=())
def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``gelu(x W^T + b)`` in one BLAS call with the GELU in the product's epilogue
    (``torch._addmm_activation``): ``x [..., K]``, ``weight [N, K]``, ``bias [N]`` -> ``[..., N]``.
    On CUDA the GELU is cuBLASLt's, the tanh approximation (Hendrycks & Gimpel 2016, section 2); on
    the CPU PyTorch applies the exact (erf) GELU after the product. A custom operator, so that
    ``torch.compile`` keeps the call whole (Inductor would split it into a product and a GELU
    kernel of its own, which reads and writes the [tokens, ffn] activations once more)."""
    y = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
    return y.view(*x.shape[:-1], weight.shape[0])


@linear_gelu.register_fake
def _linear_gelu_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = Attention(d_model, heads)
        self.self_attn_layer_norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, ffn)
        self.fc2 = nn.Linear(ffn, d_model)
        self.final_layer_norm = nn.LayerNorm(d_model)
        self.gelu_epilogue = False  # fc1 and its GELU in one product (``linear_gelu``): ``Whisper.fuse_encoder_gelu``

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.self_attn
        h = self.self_attn_layer_norm(x)
        q, k, v = a.split(a.q_proj(h)), a.split(a.k_proj(h)), a.split(a.v_proj(h))
        x = x + a.out_proj(a.merge(F.scaled_dot_product_attention(q, k, v)))
        h = self.final_layer_norm(x)
        h = linear_gelu(h, self.fc1.weight, self.fc1.bias) if self.gelu_epilogue else F.gelu(self.fc1(h))
        return x + self.fc2(h)


class Encoder(nn.Module):
    def __init__(self, d: WhisperDims) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(d.num_mel_bins, d.d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d.d_model, d.d_model, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(d.max_source_positions, d.d_model)
        with torch.no_grad():
            self.embed_positions.weight.copy_(sinusoids(d.max_source_positions, d.d_model))
        self.layers = nn.ModuleList(
            EncoderLayer(d.d_model, d.encoder_attention_heads, d.encoder_ffn_dim) for _ in range(d.encoder_layers))
        self.layer_norm = nn.LayerNorm(d.d_model)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[B, n_mels, 3000]`` -> ``[B, 1500, d_model]``."""
        x = F.gelu(self.conv1(features))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class DecoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = Attention(d_model, heads)
        self.self_attn_layer_norm = nn.LayerNorm(d_model)
        self.encoder_attn = Attention(d_model, heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, ffn)
        self.fc2 = nn.Linear(ffn, d_model)
        self.final_layer_norm = nn.LayerNorm(d_model)


class Decoder(nn.Module):
    def __init__(self, d: WhisperDims) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(d.vocab_size, d.d_model)
        self.embed_positions = nn.Embedding(d.max_target_positions, d.d_model)
        self.layers = nn.ModuleList(
            DecoderLayer(d.d_model, d.decoder_attention_heads, d.decoder_ffn_dim) for _ in range(d.decoder_layers))
        self.layer_norm = nn.LayerNorm(d.d_model)

    def blocks(self) -> list[DecoderLayer]:
        """The decoder layers, typed (``nn.ModuleList`` iterates as plain ``nn.Module``)."""
        return cast("list[DecoderLayer]", list(self.layers))


class _Body(nn.Module):
    """The ``model.encoder`` / ``model.decoder`` nesting of Hugging Face's state-dict names."""

    def __init__(self, dims: WhisperDims) -> None:
        super().__init__()
        self.encoder = Encoder(dims)
        self.decoder = Decoder(dims)


def require_triton_device(device: torch.device | str, what: str, fix: str) -> None:
    """Raise ValueError, naming ``what`` and ``fix``, unless Triton's kernels can run on ``device``:
    CUDA, or any device under Triton's interpreter (``TRITON_INTERPRET=1``, the CPU tests)."""
    if torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{what} need a CUDA device (got {device}); {fix} on the CPU")


class KVCache:
    """Preallocated K/V for ``max_batch`` rows: per decoder layer, self-attention
    ``[max_batch, heads, max_target_positions, head_dim]`` and cross-attention
    ``[max_batch, heads, max_source_positions, head_dim]``. A batch of B uses rows ``[:B]``
    (contiguous views, so a CUDA graph captured on them stays valid).

    ``cross_fp8``: the cross-attention K/V are stored as FP8 (E4M3) with a float32 scale per
    row and head (``cross_k_scale``/``cross_v_scale``, per layer ``[max_batch, heads]``), half the
    bytes a decoder step reads (``triton_kernels``'s module doc says why and how). Needs Triton
    (CUDA, or ``TRITON_INTERPRET=1`` on the CPU).

    ``cross_absorbed`` (with ``cross_fp8``): instead of each layer's keys and values, one FP8 copy
    of the encoder's output a row, ``cross_e [max_batch, max_source_positions, d_model]`` with a
    float32 scale a position (``cross_e_scale [max_batch, max_source_positions]``), which every
    layer's cross-attention reads with its projections absorbed (``cuda_kernels``'s module doc
    says why): its CUDA kernel needs a GPU of sm_89 or later, sm_90 from width 768 (shared memory);
    on the CPU it runs the kernel's
    PyTorch reference (``cuda_kernels.absorbed_attend_reference``), for tests."""

    def __init__(self, dims: WhisperDims, max_batch: int, dtype: torch.dtype, device: torch.device,
                 cross_fp8: bool = False, cross_absorbed: bool = False) -> None:
        if cross_absorbed and not cross_fp8:
            raise ValueError("cross_absorbed keeps the encoder's output in FP8: it needs cross_fp8")
        if cross_fp8 and not cross_absorbed:  # the absorbed form runs the CUDA kernel, or on the CPU its reference
            require_triton_device(device, "FP8 cross-attention keys and values", "leave cross_fp8 off")
        h, hd = dims.decoder_attention_heads, dims.d_model // dims.decoder_attention_heads
        def alloc(t: int, dt: torch.dtype = dtype) -> list[torch.Tensor]:
            return [torch.zeros(max_batch, h, t, hd, dtype=dt, device=device) for _ in range(dims.decoder_layers)]
        self.max_batch = max_batch
        self.cross_fp8 = cross_fp8
        self.cross_absorbed = cross_absorbed
        self.self_k, self.self_v = alloc(dims.max_target_positions), alloc(dims.max_target_positions)
        cross_dtype = torch.float8_e4m3fn if cross_fp8 else dtype
        t_src = dims.max_source_positions
        self.cross_e = torch.zeros(max_batch, t_src, dims.d_model, dtype=torch.float8_e4m3fn, device=device) \
            if cross_absorbed else None
        self.cross_e_scale = torch.ones(max_batch, t_src, dtype=torch.float32, device=device) if cross_absorbed else None
        self.cross_k, self.cross_v = ([], []) if cross_absorbed else (alloc(t_src, cross_dtype), alloc(t_src, cross_dtype))
        scales = (lambda: [torch.ones(max_batch, h, dtype=torch.float32, device=device)
                           for _ in range(dims.decoder_layers)]) if cross_fp8 and not cross_absorbed else list
        self.cross_k_scale: list[torch.Tensor] = scales()
        self.cross_v_scale: list[torch.Tensor] = scales()


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, impl: str) -> torch.Tensor:
    """Attention of one query position: ``q [B, H, 1, d]`` over ``k, v [B, H, T, d]``.

    ``sdpa`` uses PyTorch's fused kernels; ``matmul`` two batched matrix products with a float32
    softmax between them (for one query these are memory-bound reads of K and V)."""
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)


class Whisper(nn.Module):
    """Whisper with a serving decoder step. ``encode`` runs the encoder; ``fill_cross`` puts the
    cross-attention K/V of a batch into the cache; ``step`` decodes one token per row.
    ``attention`` picks the decoder step's attention kernels: ``sdpa`` (PyTorch's), ``matmul``
    (two matrix products), or ``triton`` (self-attention by ``triton_kernels.self_attend``, the
    cache write included, after one q/k/v product once ``fuse_qkv`` ran; cross-attention as
    ``sdpa``). An FP8 cache's cross-attention always uses ``triton_kernels.attend``."""

    ATTENTION = ("sdpa", "matmul", "triton")

    def __init__(self, dims: WhisperDims, attention: str = "sdpa") -> None:
        super().__init__()
        if attention not in self.ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(self.ATTENTION)}, got {attention!r}")
        self.dims = dims
        self.attention = attention
        self.model = _Body(dims)

    def fuse_qkv(self) -> None:
        """``Attention.fuse_qkv`` for every decoder self-attention (used by ``attention="triton"``)."""
        for layer in self.decoder.blocks():
            layer.self_attn.fuse_qkv()

    def fuse_encoder_gelu(self, on: bool = True) -> None:
        """Every encoder layer's fc1 product and its GELU in one BLAS call (``linear_gelu``), or
        back to two (``on=False``). Why: compiled, Inductor runs the GELU as a kernel of its own
        that reads and writes the [1500, ffn] activations of each window; at large-v3 size that
        kernel took 0.54 ms a window under the profiler
        (``bench/results/gpu_engine_kernels_large_v3_h100_600.txt``: 0.40 s over 750 windows), of
        an encoder that took 5.52 ms a window in the engine (H100, 2026-12-07,
        ``gpu_e2e_large_v3_h100_engine_stats.json``), and the compiled encoder ran
        4.35 against 4.69 ms a window with the GELU in the product's epilogue (batch 62; 4.71
        against 5.02 at 32; ``bench/gpu_encoder_gelu.py``, ``bench/results/gpu_encoder_gelu_h100.json``).
        On CUDA that GELU is the tanh approximation (see ``linear_gelu``): the encoder's output
        then differs from the exact GELU's by rounding (cosine 0.99997 on random large-v3
        weights), and real tiny.en wrote the same text with either on every shipped clip and the
        1, 5 and 20-minute files, Whisper base (multilingual) on all 27 clips of nine languages
        (CPU, fp32, ``bench/gelu_accuracy.py --multilingual``, ``bench/results/gelu_accuracy_cpu.json``)."""
        for layer in self.encoder.layers:
            cast(EncoderLayer, layer).gelu_epilogue = on

    @property
    def encoder(self) -> Encoder:
        return self.model.encoder

    @property
    def decoder(self) -> Decoder:
        return self.model.decoder

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        return self.encoder(features)

    def fill_cross(self, cache: KVCache, encoded: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Cross-attention K/V of ``encoded`` ``[B, 1500, d_model]`` into cache rows ``[:B]``, or
        into the rows listed by ``rows`` (``[B]`` int64, on the cache's device)."""
        b = encoded.shape[0]
        if cache.cross_e is not None and cache.cross_e_scale is not None:  # one FP8 E for every layer
            from tideserve.worker.backends.torch_whisper.cuda_kernels import quantize_positions_into
            quantize_positions_into(encoded, cache.cross_e, cache.cross_e_scale, rows)
            return
        if cache.cross_fp8:
            from tideserve.worker.backends.torch_whisper.triton_kernels import quantize_into
        for i, layer in enumerate(self.decoder.blocks()):
            a = layer.encoder_attn
            k, v = a.split(a.k_proj(encoded)), a.split(a.v_proj(encoded))
            if cache.cross_fp8:
                quantize_into(k, cache.cross_k[i], cache.cross_k_scale[i], rows)
                quantize_into(v, cache.cross_v[i], cache.cross_v_scale[i], rows)
                continue
            for dst, src in ((cache.cross_k[i], k), (cache.cross_v[i], v)):
                if rows is None:
                    dst[:b].copy_(src)
                else:
                    dst.index_copy_(0, rows, src)

    def step(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor, span: int | None = None) -> torch.Tensor:
        """One decoder step for B rows, each at its own position.

        tokens, positions: ``[B]`` int64, every position < ``span`` (default: the whole
        448-token context). Writes this step's self-attention K/V at ``positions`` and attends
        to positions <= it, reading only the first ``span`` cache positions. Returns logits
        ``[B, vocab]`` in float32. Static shapes, no host sync: safe to capture in a CUDA graph.
        """
        dec = self.decoder
        b = tokens.shape[0]
        span = span or self.dims.max_target_positions
        if cache.cross_fp8 or self.attention == "triton":  # as custom operators under torch.compile
            from tideserve.worker.backends.torch_whisper import triton_kernels as tk
            compiling = torch.compiler.is_compiling()
            fp8_attend = tk.attend_op if compiling else tk.attend
            self_attend = tk.self_attend_op if compiling else tk.self_attend
        if cache.cross_absorbed:
            from tideserve.worker.backends.torch_whisper import cuda_kernels as ck
            absorbed_attend = ck.absorbed_attend_op if torch.compiler.is_compiling() else ck.absorbed_attend
        x = (dec.embed_tokens(tokens) + dec.embed_positions(positions))[:, None, :]  # [B, 1, D]
        visible = None if self.attention == "triton" else \
            (torch.arange(span, device=tokens.device)[None, :] <= positions[:, None])[:, None, None, :]
        for i, layer in enumerate(dec.blocks()):
            a = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            if self.attention == "triton":  # the cache write and the attention in one kernel
                if a.qkv_proj is not None:  # one product (fuse_qkv); q, k, v strided views of it
                    qkv = a.qkv_proj(h).view(b, 3, a.heads, a.head_dim)
                    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
                else:
                    q, k, v = (p(h).view(b, a.heads, a.head_dim) for p in (a.q_proj, a.k_proj, a.v_proj))
                att = self_attend(q, k, v, cache.self_k[i], cache.self_v[i], positions)
                x = x + a.out_proj(att.view(b, 1, a.heads * a.head_dim))
            else:
                q, k, v = a.split(a.q_proj(h)), a.split(a.k_proj(h)), a.split(a.v_proj(h))  # [B, H, 1, hd]
                index = positions.view(b, 1, 1, 1).expand(b, a.heads, 1, a.head_dim)
                ks, vs = cache.self_k[i][:b], cache.self_v[i][:b]
                ks.scatter_(2, index, k)
                vs.scatter_(2, index, v)
                att = _attend(q, ks[:, :, :span], vs[:, :, :span], visible, self.attention)
                x = x + a.out_proj(a.merge(att))
            c = layer.encoder_attn
            h = layer.encoder_attn_layer_norm(x)
            if cache.cross_e is not None and cache.cross_e_scale is not None:
                # key projection into the query, value projection after (cuda_kernels' doc)
                q = c.q_proj(h).view(b, c.heads, c.head_dim).transpose(0, 1)  # [H, B, hd]
                qa = torch.matmul(q, c.k_proj.weight.view(c.heads, c.head_dim, -1)).transpose(0, 1)  # [B, H, D]
                u = absorbed_attend(qa, cache.cross_e, cache.cross_e_scale, c.head_dim)  # [B, H, D]
                wv = c.v_proj.weight.view(c.heads, c.head_dim, -1).transpose(1, 2)  # [H, D, hd]
                att = torch.matmul(u.transpose(0, 1), wv).transpose(0, 1) + c.v_proj.bias.view(c.heads, c.head_dim)
                x = x + c.out_proj(att.reshape(b, 1, c.heads * c.head_dim))
            elif cache.cross_fp8:
                q8 = c.q_proj(h).view(b, c.heads, c.head_dim)
                att = fp8_attend(q8, cache.cross_k[i], cache.cross_v[i], cache.cross_k_scale[i], cache.cross_v_scale[i])
                x = x + c.out_proj(att.view(b, 1, c.heads * c.head_dim))
            else:
                q = c.split(c.q_proj(h))
                cross_impl = "sdpa" if self.attention == "triton" else self.attention  # no Triton kernel for bf16
                x = x + c.out_proj(c.merge(_attend(q, cache.cross_k[i][:b], cache.cross_v[i][:b], None, cross_impl)))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
        x = dec.layer_norm(x)[:, 0, :]
        return (x @ dec.embed_tokens.weight.T).float()


    def first_position_logits(self, encoded: torch.Tensor, token: int) -> torch.Tensor:
        """Logits ``[B, vocab]`` (float32) at the decoder's first position, given ``token`` there
        (``<|startoftranscript|>`` for Whisper's language detection), over ``encoded``
        ``[B, T, d_model]`` (any T up to 1500: a shorter input is a shorter encoding). No cache:
        one position attends only to itself, so its self-attention is its value projection."""
        dec = self.decoder
        tokens = torch.full((encoded.shape[0],), token, dtype=torch.long, device=encoded.device)
        x = (dec.embed_tokens(tokens) + dec.embed_positions.weight[0])[:, None, :]  # [B, 1, D]
        for layer in dec.blocks():
            a = layer.self_attn
            x = x + a.out_proj(a.v_proj(layer.self_attn_layer_norm(x)))
            c = layer.encoder_attn
            q = c.split(c.q_proj(layer.encoder_attn_layer_norm(x)))
            k, v = c.split(c.k_proj(encoded)), c.split(c.v_proj(encoded))
            x = x + c.out_proj(c.merge(F.scaled_dot_product_attention(q, k, v)))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
        return (dec.layer_norm(x)[:, 0, :] @ dec.embed_tokens.weight.T).float()


def load_hf_dir(model_dir: Path, dtype: torch.dtype, device: torch.device) -> Whisper:
    """A Whisper from a Hugging Face-format directory: ``config.json`` and ``model.safetensors``
    (or ``pytorch_model.bin``), or from a CTranslate2 directory (``model.bin``), converted in
    memory (tideserve.engines.convert). Raises ValueError naming what is missing or mismatched."""
    model_dir = Path(model_dir)
    if (model_dir / "model.bin").is_file() and not (model_dir / "model.safetensors").is_file():
        from tideserve.engines.convert import ct2_to_hf_state, read_ct2

        _, variables = read_ct2(model_dir / "model.bin")
        arrays, sizes = ct2_to_hf_state(variables)
        return _build(WhisperDims.from_config(sizes), {k: torch.from_numpy(a.copy()) for k, a in arrays.items()},
                      model_dir, dtype, device)
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except OSError as exc:
        raise ValueError(f"{model_dir}: no readable config.json ({exc.strerror}); a Hugging Face Whisper "
                         "directory has config.json and model.safetensors") from None
    dims = WhisperDims.from_config(config)
    if (model_dir / "model.safetensors").is_file():
        from safetensors.torch import load_file
        state = load_file(str(model_dir / "model.safetensors"))
    elif (model_dir / "pytorch_model.bin").is_file():
        state = torch.load(model_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"{model_dir}: no model.safetensors or pytorch_model.bin")
    return _build(dims, state, model_dir, dtype, device)


def _build(dims: WhisperDims, state: dict[str, torch.Tensor], model_dir: Path, dtype: torch.dtype,
           device: torch.device) -> Whisper:
    with torch.device("meta"):
        model = Whisper(dims)
    state = {k: v for k, v in state.items() if k != "proj_out.weight"}  # tied to the token embedding
    if "model.encoder.embed_positions.weight" not in state:
        state["model.encoder.embed_positions.weight"] = sinusoids(dims.max_source_positions, dims.d_model)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"{model_dir}: weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)  # serving: no autograd


def pow2_bucket(n: int, cap: int) -> int:
    """The padded batch size for ``n`` rows: the smallest power of two >= ``n``, at most ``cap``
    (a CUDA graph is captured per bucket, so few buckets mean few graphs)."""
    b = 1
    while b < n:
        b *= 2
    return min(b, cap)


def compile_batch_dynamic(fn: Callable[..., Any], max_batch: int) -> Callable[..., Any]:
    """``fn`` through ``torch.compile`` with dimension 0 of its tensor arguments marked dynamic over
    2..``max_batch``: one compilation for every batch size from 2 (a size of 1 would be
    specialised and compiled again, so callers run one row eagerly). Shared by ``CompiledEncoder``
    and the decoder's compiled step (``decode.GreedyDecoder``)."""
    compiled = torch.compile(fn)

    def call(*args: Any) -> Any:
        for x in args:
            if isinstance(x, torch.Tensor):
                torch._dynamo.mark_dynamic(x, 0, min=2, max=max(2, max_batch))
        return compiled(*args)
    return call


def check_encoder_batch(n: int, max_batch: int) -> int:
    """``n``, when an encoder built for ``max_batch`` windows takes it; else ValueError."""
    if not 0 < n <= max_batch:
        raise ValueError(f"the encoder takes 1..{max_batch} windows, got {n}")
    return n


class GraphedEncoder:
    """The encoder replayed from one CUDA graph per batch bucket (powers of two up to
    ``max_batch``), so an admission's encoder pass costs the host one replay instead of a
    launch per operation. Rows are independent in Whisper's encoder, so a bucket's padding rows
    (left as they were) change nothing in the rows used.

    Why: on the H200 the engine loop serving tiny.en spent about 28% of its time launching the
    encoder's operations while the GPU waited (a py-spy profile, bench/gpu_sweep_session.sh);
    at large-v3 size the GPU is already busy (96%), so ``enabled_for`` limits graphs to models
    whose width is at most ``MAX_D_MODEL``. Graphs are captured on first use of a bucket (each
    a few forward passes) and hold that bucket's activations in a memory pool shared by all.
    """

    MAX_D_MODEL = 768  # Whisper tiny (384), base (512), small (768)

    def __init__(self, model: Whisper, max_batch: int,
                 forward: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.model = model
        self.max_batch = max_batch
        self.forward = forward or model.encode  # what is captured: the encoder, or a pass that ends in it
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._pool: Any = None

    @classmethod
    def enabled_for(cls, model: Whisper, device: torch.device) -> bool:
        return device.type == "cuda" and model.dims.d_model <= cls.MAX_D_MODEL

    @torch.inference_mode()
    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        """``[n, n_mels, 3000]`` -> ``[n, 1500, d_model]`` (a view of the bucket's output buffer,
        valid until the next call; ``forward``'s output when given; every call of one instance
        must have the same shape past the batch). Raises ValueError for more rows than ``max_batch``."""
        n = check_encoder_batch(features.shape[0], self.max_batch)
        b = pow2_bucket(n, self.max_batch)
        entry = self._graphs.get(b)
        if entry is None:
            entry = self._capture(b, features)
        graph, inp, out = entry
        inp[:n].copy_(features)
        graph.replay()
        return out[:n]

    def _capture(self, b: int, like: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        inp = torch.zeros((b, *like.shape[1:]), dtype=like.dtype, device=like.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up before capture (allocations, kernel selection)
                self.forward(inp)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self.forward(inp)
        self._graphs[b] = (graph, inp, out)
        return self._graphs[b]


class CompiledEncoder:
    """The encoder through ``torch.compile`` (Inductor: the layer norms, the convolutions' GELUs,
    residual adds and layout changes fused into few kernels between the matrix products; fc1's
    GELU rides in its product where ``Whisper.fuse_encoder_gelu`` is on, as the backend sets it for
    a compiled encoder), with the batch dimension
    compiled as dynamic, so one compilation serves every pass of 2 to ``max_pass`` windows (an
    admission of more runs in equal passes);
    a single window runs eagerly (a size of 1 would be specialised and compiled again, and padding
    it to two rows would cost a second window's encoder). Compiled at construction (one pass of two
    zero windows), not on the first request.

    Why: at large-v3 size the encoder is about 40% of the engine's GPU time per window, and there
    it is not launch-bound (graphs gave 5.89 against 5.95 ms per window on the H200), but eager
    PyTorch leaves 2.4 of its 6.3 ms per window on an H100 outside the matrix products (2.9 ms)
    and the attention (1.0 ms); compiled for one static batch of 32, 4.96 ms (24 s to compile;
    ``bench/gpu_encoder_parts.py``, 2026-12-05). With this class (dynamic batch) large-v3's engine
    alone ran 950 audio-s/s against 887 eager, side by side (H200, FP8 keys and values, batch 64,
    ``bench/results/gpu_e2e_large_v3_h200_fp8_compiled.json``). ``enabled_for`` limits it to CUDA
    models wider than ``GraphedEncoder.MAX_D_MODEL``, where the graphs are off.
    """

    # The most windows one compiled pass takes; an admission of more runs in equal passes of at
    # most this. Why: compiled for large-v3 with the batch dynamic up to 128, Dynamo refused the
    # range: the graph it built holds only for 2..64 windows ("Constraints violated ... <= 64", an
    # H100, 2026-12-07; a guess at the cause: Inductor's 32-bit indexing of a buffer that grows
    # with the batch), so a replica with ``max_batch_size`` over 64 failed at load. Every buffer
    # of a narrower model is smaller, so 64 should hold for them too (not tried); at large-v3
    # size passes of 62 windows ran 4.35 ms a window against 4.71 at 32
    # (``bench/results/gpu_encoder_gelu_h100.json``), larger passes were not measured.
    MAX_PASS = 64

    def __init__(self, model: Whisper, max_batch: int, max_pass: int = MAX_PASS) -> None:
        self.max_batch = max_batch
        self.max_pass = max(1, min(max_batch, max_pass))
        self._eager = model.encode
        self._compiled = compile_batch_dynamic(model.encode, self.max_pass)
        p = next(model.parameters())
        with torch.inference_mode():
            self._compiled(torch.zeros(2, model.dims.num_mel_bins, 3000, dtype=p.dtype, device=p.device))

    @classmethod
    def enabled_for(cls, model: Whisper, device: torch.device) -> bool:
        return device.type == "cuda" and model.dims.d_model > GraphedEncoder.MAX_D_MODEL

    @torch.inference_mode()
    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        """``[n, n_mels, 3000]`` -> ``[n, 1500, d_model]``, in equal passes of at most
        ``max_pass`` windows. Raises ValueError for more rows than ``max_batch``."""
        n = check_encoder_batch(features.shape[0], self.max_batch)
        if n > self.max_pass:  # equal passes (65 -> 33 + 32), so no single window is left to run eagerly
            return torch.cat([self(part) for part in features.tensor_split(-(-n // self.max_pass))])
        return self._eager(features) if n == 1 else self._compiled(features)
