"""Tuning the decoder's cross-attention kernel over FP8 keys and values at large-v3 size (32
layers, 20 heads of 64, 1500 positions), on the GPU: milliseconds per step for each
configuration of ``triton_kernels.attend`` (positions per block, warps, pipeline stages, parts)
of a variant that does its two products on the tensor cores (``tl.dot``: the query padded to
16 rows, keys and values converted to fp16), and of one that keeps an online softmax per slot
(position modulo the block, so nothing is reduced across positions inside the loop), against PyTorch's best kernel (cuDNN) on bf16 keys
and values; each over 32 layers in one CUDA graph, median of 30 replays. Also checks each
variant's output against attention over the dequantized values.

    python3 bench/gpu_fp8_tune.py --json $OUT/fp8_tune.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tideserve.worker.backends.torch_whisper import triton_kernels as fa
from gpu_step_parts import graph_ms


@triton.jit
def _query(q_ptr, ks_ptr, vs_ptr, H, sm_scale, q_sb, k_sb, k_sh, s_sb, D: tl.constexpr):
    """This program's row and head, the head's offsets ``d``, its query with the key's scale and
    1/sqrt(D) folded in, the value's scale, and the offset of its keys and values."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * q_sb + h * D + d).to(tl.float32)
    qs = q * (tl.load(ks_ptr + b * s_sb + h) * sm_scale)
    return b, h, d, qs, tl.load(vs_ptr + b * s_sb + h), b * k_sb + h * k_sh


@triton.jit
def _attend_dot_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, H, T, sm_scale,
                       q_sb, k_sb, k_sh, k_st, s_sb, o_sb,
                       D: tl.constexpr, BLOCK_T: tl.constexpr):
    b, h, d, qs, v_scale, base = _query(q_ptr, ks_ptr, vs_ptr, H, sm_scale, q_sb, k_sb, k_sh, s_sb, D)
    r = tl.arange(0, 16)
    q16 = tl.where(r[:, None] == 0, qs[None, :], 0.0).to(tl.float16)  # [16, D], row 0 real
    m = tl.full((16,), float("-inf"), tl.float32)
    denom = tl.zeros((16,), tl.float32)
    acc = tl.zeros((16, D), tl.float32)
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        valid = t < T
        kb = tl.load(k_ptr + base + t[:, None] * k_st + d[None, :], mask=valid[:, None], other=0.0).to(tl.float16)
        s = tl.dot(q16, tl.trans(kb))  # [16, BLOCK_T]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        vb = tl.load(v_ptr + base + t[:, None] * k_st + d[None, :], mask=valid[:, None], other=0.0).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), vb)
        denom = denom * alpha + tl.sum(p, axis=1)
        m = m_new
    o = acc * (v_scale / denom)[:, None]
    tl.store(out_ptr + b * o_sb + h * D + r[:, None] * 0 + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=r[:, None] == 0)


@triton.jit
def _attend_slots_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, H, T, sm_scale,
                         q_sb, k_sb, k_sh, k_st, s_sb, o_sb,
                         D: tl.constexpr, BLOCK_T: tl.constexpr):
    # Online softmax per slot (position modulo BLOCK_T): no reduction across positions inside
    # the loop, one at the end.
    b, h, d, qs, v_scale, base = _query(q_ptr, ks_ptr, vs_ptr, H, sm_scale, q_sb, k_sb, k_sh, s_sb, D)
    m = tl.full((BLOCK_T,), float("-inf"), tl.float32)
    den = tl.zeros((BLOCK_T,), tl.float32)
    acc = tl.zeros((BLOCK_T, D), tl.float32)
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        valid = t < T
        kb = tl.load(k_ptr + base + t[:, None] * k_st + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.where(valid, tl.sum(kb * qs[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m, s)
        alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m - m_new))
        p = tl.where(valid, tl.exp(s - m_new), 0.0)
        vb = tl.load(v_ptr + base + t[:, None] * k_st + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + p[:, None] * vb
        den = den * alpha + p
        m = m_new
    top = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - top))
    o = tl.sum(acc * w[:, None], axis=0) * (v_scale / tl.sum(den * w, axis=0))
    tl.store(out_ptr + b * o_sb + h * D + d, o.to(out_ptr.dtype.element_ty))


def attend_slots(q, k8, v8, ks, vs, block_t=64, num_warps=4, num_stages=3):
    b, h, d = q.shape
    out = torch.empty_like(q)
    _attend_slots_kernel[(b * h,)](q, k8, v8, ks, vs, out, h, k8.shape[2], d ** -0.5,
                                   q.stride(0), k8.stride(0), k8.stride(1), k8.stride(2), ks.stride(0), out.stride(0),
                                   D=d, BLOCK_T=block_t, num_warps=num_warps, num_stages=num_stages)
    return out


def attend_dot(q, k8, v8, ks, vs, block_t=128, num_warps=4, num_stages=3):
    b, h, d = q.shape
    out = torch.empty_like(q)
    _attend_dot_kernel[(b * h,)](q, k8, v8, ks, vs, out, h, k8.shape[2], d ** -0.5,
                                 q.stride(0), k8.stride(0), k8.stride(1), k8.stride(2), ks.stride(0), out.stride(0),
                                 D=d, BLOCK_T=block_t, num_warps=num_warps, num_stages=num_stages)
    return out


def tune_batch(b: int) -> dict:
    """One batch size's row (see the module doc)."""
    dev, layers, heads, t_src, hd = "cuda", 32, 20, 1500, 64
    torch.manual_seed(0)
    kb = [torch.randn(b, heads, t_src, hd, device=dev, dtype=torch.bfloat16) for _ in range(layers)]
    vb = [torch.randn_like(x) for x in kb]
    k8, v8 = [fa.quantize(x) for x in kb], [fa.quantize(x) for x in vb]
    ones = torch.ones(b, heads, device=dev)
    q = torch.randn(b, heads, hd, device=dev, dtype=torch.bfloat16)
    fp8_bytes = 2 * b * t_src * heads * hd * layers
    ref = F.scaled_dot_product_attention(q[:, :, None].float(), k8[0][0].float() * k8[0][1][:, :, None, None],
                                         v8[0][0].float() * v8[0][1][:, :, None, None])[:, :, 0]
    row: dict = {"batch": b, "fp8_GB_per_step": fp8_bytes / 1e9}
    row["cudnn_bf16_ms"] = graph_ms(lambda: [F.scaled_dot_product_attention(q[:, :, None], kb[i], vb[i])
                                             for i in range(layers)])
    configs = [(bt, w, st, 1) for bt in (128, 256) for w in (4, 8) for st in (2, 3)] + [(128, 4, 3, 2)]
    for bt, w, st, sp in configs:
        name = f"fma_t{bt}_w{w}_st{st}_s{sp}"
        try:
            out = fa.attend(q, k8[0][0], v8[0][0], k8[0][1], v8[0][1], split=sp, block_t=bt, num_warps=w, num_stages=st)
            row[name + "_err"] = (out.float() - ref).abs().max().item()
            row[name] = graph_ms(lambda bt=bt, w=w, st=st, sp=sp: [
                fa.attend(q, k8[i][0], v8[i][0], k8[i][1], v8[i][1], split=sp, block_t=bt, num_warps=w,
                          num_stages=st) for i in range(layers)])
        except Exception as exc:  # a configuration Triton cannot build (registers, shared memory)
            row[name] = f"failed: {str(exc).splitlines()[0][:100]}"
    for bt, w, st in [(bt, 4, st) for bt in (64, 128) for st in (2, 3)]:
        name = f"dot_t{bt}_w{w}_st{st}"
        try:
            out = attend_dot(q, k8[0][0], v8[0][0], k8[0][1], v8[0][1], bt, w, st)
            row[name + "_err"] = (out.float() - ref).abs().max().item()
            row[name] = graph_ms(lambda bt=bt, w=w, st=st: [
                attend_dot(q, k8[i][0], v8[i][0], k8[i][1], v8[i][1], bt, w, st) for i in range(layers)])
        except Exception as exc:
            row[name] = f"failed: {str(exc).splitlines()[0][:100]}"
    for bt, w, st in [(bt, w, 2) for bt in (32, 64) for w in (4, 8)]:
        name = f"slots_t{bt}_w{w}_st{st}"
        try:
            out = attend_slots(q, k8[0][0], v8[0][0], k8[0][1], v8[0][1], bt, w, st)
            row[name + "_err"] = (out.float() - ref).abs().max().item()
            row[name] = graph_ms(lambda bt=bt, w=w, st=st: [
                attend_slots(q, k8[i][0], v8[i][0], k8[i][1], v8[i][1], bt, w, st) for i in range(layers)])
        except Exception as exc:
            row[name] = f"failed: {str(exc).splitlines()[0][:100]}"
    for bt, w in ((128, 4),):  # the same kernel over bf16 values (scales 1): conversion's cost
        row[f"fma_bf16kv_t{bt}_w{w}_ms"] = graph_ms(lambda bt=bt, w=w: [
            fa.attend(q, kb[i], vb[i], ones, ones, block_t=bt, num_warps=w) for i in range(layers)])
    timed = {k: v for k, v in row.items() if isinstance(v, float) and k.startswith(("fma_", "dot_", "slots_"))
             and not k.endswith("_err") and "bf16kv" not in k}
    best = min(timed, key=lambda k: timed[k])
    row["best"], row["best_ms"], row["best_TBps"] = best, timed[best], fp8_bytes / timed[best] / 1e9
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="64,128")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = []
    for b in (int(x) for x in a.batch_sizes.split(",")):
        row = tune_batch(b)
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("batch", "cudnn_bf16_ms", "best", "best_ms", "best_TBps")}), flush=True)
        torch.cuda.empty_cache()
        if a.json:  # after each batch size, so that a run cut short keeps what it measured
            a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "triton": triton.__version__,
                                          "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
