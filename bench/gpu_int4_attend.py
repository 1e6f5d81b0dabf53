"""Would 4-bit cross-attention keys and values speed up large-v3's decoder step? On the GPU:
milliseconds per step (32 layers, 20 heads of 64, 1,500 positions, median of 30 CUDA graph
replays) of the served FP8 kernel (``triton_kernels.attend``) against a 4-bit one, at several
batch sizes, and each one's largest error against attention over its own dequantized values.

The 4-bit layout (an experiment here, not served): values rounded to -7..7 with one float32
scale per row and head (as the FP8 cache), stored offset by 8, two to a byte (even dimension in
the low nibble), ``[B, H, T, D / 2]`` uint8. Whether the text survives that rounding is measured
apart, on the CPU with real tiny.en weights (``bench/kv_quant_accuracy.py``).

    python3 bench/gpu_int4_attend.py --json $OUT/int4_attend.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tideserve.worker.backends.torch_whisper import triton_kernels as fa
from gpu_step_parts import graph_ms


def pack_int4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [B, H, T, D]`` -> ``(packed [B, H, T, D / 2] uint8, scale [B, H] float32)`` with
    ``x ~= (nibble - 8) * scale``; ``scale = amax(|x|) / 7`` per row and head."""
    scale = (x.abs().amax(dim=(2, 3)).float() / 7.0).clamp(min=1e-12)
    q = (x.float() / scale[:, :, None, None]).round().clamp(-7, 7).to(torch.int16) + 8
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8)
    return packed.contiguous(), scale


def unpack_int4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    lo = (packed & 15).float() - 8
    hi = (packed >> 4).float() - 8
    return torch.stack((lo, hi), dim=-1).flatten(-2) * scale[:, :, None, None]


@triton.jit
def _nibbles(x):
    """The low and high nibbles of bytes ``x`` (int32) as float32 0..15: OR a nibble into the
    mantissa of 2^23 and subtract 2^23, instead of integer-to-float conversions (no faster on an
    H100: 3.31 against 3.23 ms a step at batch 64, ``bench/results/gpu_int4_attend_h100.json``)."""
    lo = ((x & 15) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    hi = (((x >> 4) & 15) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return lo, hi


@triton.jit
def _attend4_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, H, T, sm_scale,
                    q_sb, k_sb, k_sh, k_st, s_sb, o_sb,
                    D2: tl.constexpr, BLOCK_T: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    d2 = tl.arange(0, D2)
    qrow = q_ptr + b * q_sb + h * (2 * D2)
    fold = tl.load(ks_ptr + b * s_sb + h) * sm_scale
    q_even = tl.load(qrow + 2 * d2).to(tl.float32) * fold
    q_odd = tl.load(qrow + 2 * d2 + 1).to(tl.float32) * fold
    offset = 8.0 * (tl.sum(q_even, axis=0) + tl.sum(q_odd, axis=0))  # the stored values are offset by 8
    v_scale = tl.load(vs_ptr + b * s_sb + h)
    base = b * k_sb + h * k_sh
    m = tl.full((), float("-inf"), tl.float32)
    denom = tl.zeros((), tl.float32)
    acc_even = tl.zeros((D2,), tl.float32)
    acc_odd = tl.zeros((D2,), tl.float32)
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        valid = t < T
        k_lo, k_hi = _nibbles(tl.load(k_ptr + base + t[:, None] * k_st + d2[None, :], mask=valid[:, None],
                                      other=0).to(tl.int32))
        s = tl.sum(k_lo * q_even[None, :] + k_hi * q_odd[None, :], axis=1) - offset
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        v_lo, v_hi = _nibbles(tl.load(v_ptr + base + t[:, None] * k_st + d2[None, :], mask=valid[:, None],
                                      other=0).to(tl.int32))
        acc_even = acc_even * alpha + tl.sum(p[:, None] * v_lo, axis=0)
        acc_odd = acc_odd * alpha + tl.sum(p[:, None] * v_hi, axis=0)
        denom = denom * alpha + tl.sum(p, axis=0)
        m = m_new
    out = out_ptr + b * o_sb + h * (2 * D2)
    # sum p (v - 8) = sum p v - 8 sum p
    tl.store(out + 2 * d2, ((acc_even - 8.0 * denom) * (v_scale / denom)).to(out_ptr.dtype.element_ty))
    tl.store(out + 2 * d2 + 1, ((acc_odd - 8.0 * denom) * (v_scale / denom)).to(out_ptr.dtype.element_ty))


def attend4(q: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
            block_t: int = 256, num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """``q [B, H, D]`` (contiguous) over packed 4-bit keys and values ``[B, H, T, D / 2]``
    (contiguous, the same strides) -> ``[B, H, D]`` in q's dtype."""
    b, h, d = q.shape
    t = k4.shape[2]
    out = torch.empty_like(q)
    _attend4_kernel[(b * h,)](q, k4, v4, k_scale, v_scale, out, h, t, d ** -0.5,
                              q.stride(0), k4.stride(0), k4.stride(1), k4.stride(2), k_scale.stride(0), out.stride(0),
                              D2=d // 2, BLOCK_T=block_t, num_warps=num_warps, num_stages=num_stages)
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    s = torch.einsum("bhd,bhtd->bht", q.float(), k.float()) * q.shape[-1] ** -0.5
    return torch.einsum("bht,bhtd->bhd", s.softmax(-1), v.float())


def measure(b: int, layers: int, h: int = 20, t: int = 1500, d: int = 64) -> dict[str, object]:
    """One batch size: both kernels' errors and milliseconds per step of ``layers`` layers."""
    dev = "cuda"
    q = torch.randn(b, h, d, device=dev, dtype=torch.bfloat16)
    k8, v8, k4, v4 = [], [], [], []
    for _ in range(layers):
        k = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16) * 2
        v = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16)
        k8.append(fa.quantize(k))
        v8.append(fa.quantize(v))
        k4.append(pack_int4(k))
        v4.append(pack_int4(v))
    row: dict[str, object] = {"batch": b, "layers": layers}
    ref8 = reference(q, k8[0][0].float() * k8[0][1][:, :, None, None], v8[0][0].float() * v8[0][1][:, :, None, None])
    row["fp8_err"] = (fa.attend(q, k8[0][0], v8[0][0], k8[0][1], v8[0][1]).float() - ref8).abs().max().item()
    ref4 = reference(q, unpack_int4(*k4[0]), unpack_int4(*v4[0]))
    row["int4_err"] = (attend4(q, k4[0][0], v4[0][0], k4[0][1], v4[0][1]).float() - ref4).abs().max().item()
    fp8_ms = graph_ms(lambda: [fa.attend(q, k8[i][0], v8[i][0], k8[i][1], v8[i][1]) for i in range(layers)])
    row["fp8_ms"] = fp8_ms
    timed = []
    for bt, w in ((256, 4), (128, 4), (256, 8), (512, 8)):
        try:
            ms = graph_ms(lambda bt=bt, w=w: [attend4(q, k4[i][0], v4[i][0], k4[i][1], v4[i][1], block_t=bt,
                                                      num_warps=w) for i in range(layers)])
            row[f"int4_ms_block{bt}_warps{w}"] = ms
            timed.append(ms)
        except Exception as exc:  # a configuration Triton cannot build
            row[f"int4_ms_block{bt}_warps{w}"] = f"failed: {str(exc).splitlines()[0][:100]}"
    gb8 = 2 * layers * b * h * t * d / 1e9  # the FP8 keys and values read per step
    row["fp8_tb_per_s"] = gb8 / fp8_ms
    if timed:
        row["int4_best_ms"] = min(timed)
        row["int4_tb_per_s"] = gb8 / 2 / min(timed)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="16,64,128")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for b in (int(x) for x in a.batch_sizes.split(",")):
        rows.append(measure(b, a.layers))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    if a.json:
        a.json.write_text(json.dumps({"command": "python3 bench/gpu_int4_attend.py " + " ".join(sys.argv[1:]),
                                      "device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
