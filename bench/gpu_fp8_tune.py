"""Tuning the decoder's cross-attention kernel over FP8 keys and values at large-v3 size (32
layers, 20 heads of 64, 1500 positions), on the GPU: milliseconds per step for each
configuration of ``triton_kernels.attend`` (positions per block, warps, pipeline stages, parts)
of a variant that does its two products on the tensor cores (``tl.dot``: the query padded to
16 rows, keys and values converted to fp16), and of one that keeps an online softmax per slot
(position modulo the block, so nothing is reduced across positions inside the loop), against PyTorch's best kernel (cuDNN) on bf16 keys
and values; each over 32 layers in one CUDA graph, median of 30 replays. Also checks each
variant's output against attention over the dequantized values.

Families (``--families``): ``fma`` (the shipped kernel), ``dot`` (tensor cores), ``slots``, and
since 2026-12-07 ``dotwide`` (tensor cores at 64-256 positions, 4-8 warps, 3-5 stages), ``pipe``
(the shipped loop with Triton's software pipelining asked for on the loop, ``tl.range(...,
num_stages=)``: asynchronous copies of the next blocks while this one is reduced) and ``pre``
(the next block's keys and values loaded into registers before this block is reduced), and
``split`` (each row and head cut into 2 or 4 parts with a Triton combine: more programs than the
1,280 of batch 64, whose last wave leaves SMs idle; named ``split_t{block}_w{warps}_st{parts}``).
(``bench/results/gpu_fp8_tune_families_h100.json`` names its ``dotwide`` rows ``dot_``: it was
measured before they had a name of their own, and that run had no ``dot`` family.)
The last four ask whether the shipped kernel, which reads about 2.7 TB/s on an H100 and about 2.8 on an
H200 (58% of its 4.8 TB/s), is short of loads in flight rather than of bandwidth.

    python3 bench/gpu_fp8_tune.py --json $OUT/fp8_tune.json [--families fma,dotwide,pipe,pre]
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
from tideserve.worker.backends.torch_whisper.triton_kernels import _online_block
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


@triton.jit
def _attend_pipe_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, H, T, sm_scale,
                        q_sb, k_sb, k_sh, k_st, s_sb, o_sb,
                        D: tl.constexpr, BLOCK_T: tl.constexpr, STAGES: tl.constexpr):
    # The shipped kernel's loop with Triton's software pipelining asked for on the loop itself
    # (``tl.range(..., num_stages=)``): the next blocks' loads in flight while this one is reduced.
    b, h, d, qs, v_scale, base = _query(q_ptr, ks_ptr, vs_ptr, H, sm_scale, q_sb, k_sb, k_sh, s_sb, D)
    m = tl.full((), float("-inf"), tl.float32)
    denom = tl.zeros((), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    for t0 in tl.range(0, T, BLOCK_T, num_stages=STAGES):
        m, denom, acc = _online_block(k_ptr + base, v_ptr + base, k_st, k_st, t0, T, d, qs, m, denom, acc, BLOCK_T)
    tl.store(out_ptr + b * o_sb + h * D + d, (acc * (v_scale / denom)).to(out_ptr.dtype.element_ty))


@triton.jit
def _attend_pre_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, H, T, sm_scale,
                       q_sb, k_sb, k_sh, k_st, s_sb, o_sb,
                       D: tl.constexpr, BLOCK_T: tl.constexpr):
    # The next block's keys and values loaded (into registers) before this block is reduced.
    b, h, d, qs, v_scale, base = _query(q_ptr, ks_ptr, vs_ptr, H, sm_scale, q_sb, k_sb, k_sh, s_sb, D)
    m = tl.full((), float("-inf"), tl.float32)
    denom = tl.zeros((), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    t = tl.arange(0, BLOCK_T)
    kb = tl.load(k_ptr + base + t[:, None] * k_st + d[None, :], mask=(t < T)[:, None], other=0.0)
    vb = tl.load(v_ptr + base + t[:, None] * k_st + d[None, :], mask=(t < T)[:, None], other=0.0)
    for t0 in range(0, T, BLOCK_T):
        tn = t0 + BLOCK_T + tl.arange(0, BLOCK_T)
        kn = tl.load(k_ptr + base + tn[:, None] * k_st + d[None, :], mask=(tn < T)[:, None], other=0.0)
        vn = tl.load(v_ptr + base + tn[:, None] * k_st + d[None, :], mask=(tn < T)[:, None], other=0.0)
        valid = t0 + t < T
        s = tl.where(valid, tl.sum(kb.to(tl.float32) * qs[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        denom = denom * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * vb.to(tl.float32), axis=0)
        m = m_new
        kb = kn
        vb = vn
    tl.store(out_ptr + b * o_sb + h * D + d, (acc * (v_scale / denom)).to(out_ptr.dtype.element_ty))


@triton.jit
def _combine_kernel(part_ptr, out_ptr, H, o_sb, D: tl.constexpr, SPLIT: tl.constexpr):
    # The parts of one row and head (flash-decoding's second pass): each part's unnormalised sum
    # weighted by exp(its max - the largest), over the weighted denominators.
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    d = tl.arange(0, D)
    sp = tl.arange(0, SPLIT)
    base = part_ptr + (bh * SPLIT + sp) * (D + 2)
    m = tl.load(base + D)
    w = tl.exp(m - tl.max(m, axis=0))
    acc = tl.load(base[:, None] + d[None, :])
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(tl.load(base + D + 1) * w, axis=0)
    tl.store(out_ptr + b * o_sb + h * D + d, o.to(out_ptr.dtype.element_ty))


def attend_split(q, k8, v8, ks, vs, block_t=128, num_warps=4, split=2):
    """The shipped kernel's parts (``SPLIT`` programs per row and head) and a Triton combine:
    two kernels a layer, where ``triton_kernels.attend(split=)`` combines in eager PyTorch."""
    b, h, d = q.shape
    out = torch.empty_like(q)
    part = torch.empty((b * h, split, d + 2), dtype=torch.float32, device=q.device)
    fa._attend_kernel[(b * h, split)](
        q, k8, v8, ks, vs, out, part, h, k8.shape[2], d ** -0.5,
        q.stride(0), q.stride(1), k8.stride(0), k8.stride(1), k8.stride(2), v8.stride(0), v8.stride(1), v8.stride(2),
        ks.stride(0), out.stride(0), out.stride(1), D=d, BLOCK_T=block_t, SPLIT=split, num_warps=num_warps,
        num_stages=3)
    _combine_kernel[(b * h,)](part, out, h, out.stride(0), D=d, SPLIT=split, num_warps=1)
    return out


def _launch(kernel, q, k8, v8, ks, vs, block_t, num_warps, num_stages, stages_in_loop=False):
    """One program per row and head of ``kernel`` (the variants' shared signature); ``num_stages``
    goes to the loop's ``tl.range`` (the kernel's STAGES) where ``stages_in_loop``, else to Triton's
    launch."""
    b, h, d = q.shape
    out = torch.empty_like(q)
    stages = {"STAGES": num_stages} if stages_in_loop else {"num_stages": num_stages}
    kernel[(b * h,)](q, k8, v8, ks, vs, out, h, k8.shape[2], d ** -0.5,
                     q.stride(0), k8.stride(0), k8.stride(1), k8.stride(2), ks.stride(0), out.stride(0),
                     D=d, BLOCK_T=block_t, num_warps=num_warps, **stages)
    return out


def attend_slots(q, k8, v8, ks, vs, block_t=64, num_warps=4, num_stages=3):
    return _launch(_attend_slots_kernel, q, k8, v8, ks, vs, block_t, num_warps, num_stages)


def attend_dot(q, k8, v8, ks, vs, block_t=128, num_warps=4, num_stages=3):
    return _launch(_attend_dot_kernel, q, k8, v8, ks, vs, block_t, num_warps, num_stages)


def attend_pipe(q, k8, v8, ks, vs, block_t=128, num_warps=4, num_stages=3):
    return _launch(_attend_pipe_kernel, q, k8, v8, ks, vs, block_t, num_warps, num_stages, stages_in_loop=True)


def attend_pre(q, k8, v8, ks, vs, block_t=128, num_warps=4, num_stages=1):
    return _launch(_attend_pre_kernel, q, k8, v8, ks, vs, block_t, num_warps, num_stages)


FAMILIES = {  # (positions per block, warps, stages[, parts]) tried per family
    "fma": [(bt, w, st, 1) for bt in (128, 256) for w in (4, 8) for st in (2, 3)] + [(128, 4, 3, 2)],
    "dot": [(bt, 4, st) for bt in (64, 128) for st in (2, 3)],
    "dotwide": [(bt, w, st) for bt in (64, 128, 256) for w in (4, 8) for st in (3, 4, 5)],
    "slots": [(bt, w, 2) for bt in (32, 64) for w in (4, 8)],
    "pipe": [(bt, w, st) for bt in (64, 128, 256) for w in (4, 8) for st in (2, 3, 4)],
    "pre": [(bt, w, 1) for bt in (64, 128) for w in (4, 8)] + [(32, 2, 1), (64, 2, 1)],
    "split": [(bt, 4, sp) for bt in (128, 256) for sp in (2, 4)],  # the third number: parts, not stages
}


def tune_batch(b: int, families: set[str]) -> dict:
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
    def timed(name, fn):  # one configuration: its error on layer 0, then ms per step over the 32 layers
        try:
            row[name + "_err"] = (fn(0).float() - ref).abs().max().item()
            row[name] = graph_ms(lambda: [fn(i) for i in range(layers)])
        except Exception as exc:  # a configuration Triton cannot build (registers, shared memory)
            row[name] = f"failed: {str(exc).splitlines()[0][:100]}"

    def kv(i):
        return k8[i][0], v8[i][0], k8[i][1], v8[i][1]

    if "fma" in families:  # the shipped kernel (triton_kernels.attend)
        for bt, w, st, sp in FAMILIES["fma"]:
            timed(f"fma_t{bt}_w{w}_st{st}_s{sp}", lambda i, bt=bt, w=w, st=st, sp=sp: fa.attend(
                q, *kv(i), split=sp, block_t=bt, num_warps=w, num_stages=st))
    for fam, fn in (("dot", attend_dot), ("dotwide", attend_dot), ("slots", attend_slots),
                    ("pipe", attend_pipe), ("pre", attend_pre), ("split", attend_split)):
        if fam in families:
            for bt, w, st in FAMILIES[fam]:
                timed(f"{fam}_t{bt}_w{w}_st{st}",
                      lambda i, fn=fn, bt=bt, w=w, st=st: fn(q, *kv(i), bt, w, st))
    for bt, w in ((128, 4),):  # the same kernel over bf16 values (scales 1): conversion's cost
        row[f"fma_bf16kv_t{bt}_w{w}_ms"] = graph_ms(lambda bt=bt, w=w: [
            fa.attend(q, kb[i], vb[i], ones, ones, block_t=bt, num_warps=w) for i in range(layers)])
    times = {k: v for k, v in row.items() if isinstance(v, float) and k.split("_")[0] in FAMILIES
             and not k.endswith("_err") and "bf16kv" not in k}
    best = min(times, key=lambda k: times[k])
    row["best"], row["best_ms"], row["best_TBps"] = best, times[best], fp8_bytes / times[best] / 1e9
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="64,128")
    ap.add_argument("--families", default="fma,dot,slots",
                    help=f"comma list of variant families to time, of {','.join(FAMILIES)} (default: those of 2026-12-05)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = []
    for b in (int(x) for x in a.batch_sizes.split(",")):
        row = tune_batch(b, set(a.families.split(",")))
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("batch", "cudnn_bf16_ms", "best", "best_ms", "best_TBps")}), flush=True)
        torch.cuda.empty_cache()
        if a.json:  # after each batch size, so that a run cut short keeps what it measured
            a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "triton": triton.__version__,
                                          "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
