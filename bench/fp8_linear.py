"""FP8 matrix products for the torch backend's Whisper, an experiment (README, Serving path (12)):
tried on large-v3 shapes on an H100 and slower there, so not part of the backend.

``Fp8Linear`` replaces an ``nn.Linear``: its weight stored as FP8 (E4M3) with a float32 scale per
output channel, its input quantized at run time with a scale per row (per token), and one
``torch._scaled_mm`` multiplying them and applying both scales (float32 accumulation, the
input's dtype out). That is what vLLM calls ``fp8`` quantization with dynamic per-token
activation scales and per-channel weight scales: half the weight bytes a decoder step reads, and
the FP8 tensor cores for the encoder's products. ``quantize_fp8`` swaps every product of the
encoder's and decoder's layers.

    from fp8_linear import quantize_fp8   # bench/ on sys.path
    quantize_fp8(model)                   # after fuse_qkv and the model's last .to()
"""

from __future__ import annotations

import torch
from torch import nn

from tideserve.worker.backends.torch_whisper.model import Attention, Whisper

#: The largest finite E4M3 value (OCP 8-bit floating point specification, 2023): each scale maps a
#: row's or a channel's largest magnitude onto it.
E4M3_MAX = 448.0


class Fp8Linear(nn.Module):
    """``linear`` with FP8 operands (see the module doc). Input ``[..., in_features]``, output
    ``[..., out_features]``. Raises ValueError when a dimension is not a multiple of 16
    (``_scaled_mm``'s constraint)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        out_f, in_f = linear.weight.shape
        if in_f % 16 or out_f % 16:
            raise ValueError(f"an FP8 matrix product needs both dimensions divisible by 16, got {out_f}x{in_f}")
        self.in_features, self.out_features = in_f, out_f
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / E4M3_MAX
        self.register_buffer("weight", (w / scale[:, None]).to(torch.float8_e4m3fn))  # [out, in]
        self.register_buffer("weight_scale", scale[None, :].contiguous())  # [1, out] float32
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        scale = rows.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX  # [M, 1]
        q = (rows.float() / scale).to(torch.float8_e4m3fn)
        # the weight transposed is column-major, as _scaled_mm wants its second operand
        y = torch._scaled_mm(q, self.weight.t(), scale_a=scale, scale_b=self.weight_scale, out_dtype=x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def quantize_fp8(model: Whisper) -> int:
    """Replace every ``nn.Linear`` of ``model``'s encoder and decoder layers (attention projections,
    the fused q/k/v product of ``fuse_qkv``, the MLP) by ``Fp8Linear``; the convolutions,
    embeddings and the output projection (the tied token embedding) stay. Returns how many. The
    encoder's fc1 then runs with its GELU apart (``Whisper.fuse_encoder_gelu(False)``): the fused
    call takes fc1's bf16 weight, which an ``Fp8Linear`` holds as E4M3 without its scale."""
    model.fuse_encoder_gelu(False)
    n = 0
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        for parent in [layer, *(m for m in layer.children() if isinstance(m, Attention))]:
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, Fp8Linear(child))
                    n += 1
    return n
