"""The torch backend's Triton kernels for the decoder step (the only module that imports Triton:
one adapter for the library): attention of one decoder position over FP8 cross-attention keys
and values, and the self-attention with its cache write in one kernel.

Why FP8: at large-v3 size a decoder step reads every row's cross-attention keys and values, 32
layers x 2 x 1500 positions x 1280 values (15.7 GB per step at batch 64, bf16), and PyTorch's
best kernel (cuDNN) already reads them at about 92% of the H200's bandwidth, 3.7 of a 7.9 ms step
(``bench/gpu_step_parts.py``, ``bench/results/gpu_step_parts_h200.json``). Stored as FP8 (E4M3,
one byte) they are half the bytes. TensorRT-LLM and vLLM keep FP8 KV caches the same way (a scale
per tensor; here one per row and head, so one loud window does not coarsen another's).

- ``quantize(x)``: ``x [B, H, T, D]`` (bf16/fp16/fp32) -> ``(x8 [B, H, T, D] float8_e4m3fn,
  scale [B, H] float32)`` with ``x ~= x8 * scale``; ``scale = amax(|x|) / 448`` per row and head
  (448: E4M3's largest finite value), never 0. ``quantize_into`` writes the same into a cache.
- ``attend(q, k8, v8, k_scale, v_scale)``: ``q [B, H, D]`` -> ``[B, H, D]`` in q's dtype,
  ``softmax(q k^T / sqrt(D)) v`` over all T positions with ``k = k8 * k_scale``, ``v = v8 *
  v_scale``; float32 inside. ``k8``/``v8`` may be the first B rows of a larger cache (views with
  the cache's strides). ``split`` > 1 cuts T into that many parts, each a program, and combines
  them (flash-decoding): more programs in flight when B x H is small.
- ``self_attend``: a step's self-attention over each row's own length, writing this step's keys
  and values into the (bf16/fp16/fp32) cache.

Runs on CUDA (Triton compiles the kernels for the device); with ``TRITON_INTERPRET=1`` set before
this module is imported they run on CPU tensors (slowly), which is how the CPU tests check them.
Raises ValueError for inputs they do not take (head size or block not a power of two, shapes,
strides or dtypes that do not match). Positions are not checked against the cache's length
(that would cost a host synchronisation per step): the caller keeps them below it."""

from __future__ import annotations

import torch

import triton
import triton.language as tl

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See the module doc. ``x [B, H, T, D]``; returns ``(x8, scale)``."""
    if x.dim() != 4:
        raise ValueError(f"quantize takes [B, H, T, D], got shape {tuple(x.shape)}")
    amax = x.abs().amax(dim=(2, 3)).float()
    scale = torch.clamp(amax / E4M3_MAX, min=1e-12)
    x8 = (x.float() / scale[:, :, None, None]).to(torch.float8_e4m3fn)
    return x8, scale


@triton.jit
def _quantize_into_kernel(x_ptr, dst_ptr, scale_ptr, rows_ptr, H, T,
                          x_sb, x_sh, x_st, d_sb, d_sh, d_st, s_sb,
                          D: tl.constexpr, BLOCK_T: tl.constexpr, HAS_ROWS: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    row = tl.load(rows_ptr + b) if HAS_ROWS else b
    d = tl.arange(0, D)
    src = x_ptr + b * x_sb + h * x_sh
    amax = tl.zeros((BLOCK_T, D), tl.float32)
    for t0 in range(0, T, BLOCK_T):  # pass 1: the largest magnitude of this row and head
        t = t0 + tl.arange(0, BLOCK_T)
        x = tl.load(src + t[:, None] * x_st + d[None, :], mask=(t < T)[:, None], other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(tl.max(amax, axis=1), axis=0) / 448.0, 1e-12)
    tl.store(scale_ptr + row * s_sb + h, scale)
    dst = dst_ptr + row * d_sb + h * d_sh
    for t0 in range(0, T, BLOCK_T):  # pass 2: scaled, rounded to E4M3, into the cache row
        t = t0 + tl.arange(0, BLOCK_T)
        x = tl.load(src + t[:, None] * x_st + d[None, :], mask=(t < T)[:, None], other=0.0).to(tl.float32)
        scaled = tl.math.div_rn(x, tl.zeros_like(x) + scale)  # IEEE division, as PyTorch's (Triton's / is approximate)
        tl.store(dst + t[:, None] * d_st + d[None, :], scaled.to(dst_ptr.dtype.element_ty), mask=(t < T)[:, None])


def _check_scales(name: str, cache: torch.Tensor, *scales: torch.Tensor) -> None:
    """Scales are float32 ``[max_batch, H]`` with contiguous rows, one per cache row and head."""
    for sc in scales:
        if sc.shape != cache.shape[:2] or sc.dtype != torch.float32 or sc.stride(1) != 1 \
                or sc.stride(0) != scales[0].stride(0):
            raise ValueError(f"{name}: scales must be float32 {tuple(cache.shape[:2])} with contiguous rows, got "
                             f"{sc.dtype} {tuple(sc.shape)} strides {sc.stride()}")


def quantize_into(x: torch.Tensor, dst: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """``quantize(x)`` written straight into a cache: ``x [B, H, T, D]`` (any strides with the
    last dimension contiguous, e.g. a projection's ``[B, T, H * D]`` output viewed per head) into
    ``dst [max_batch, H, T, D]`` (float8_e4m3fn) and ``scale [max_batch, H]`` (float32) at rows
    ``[:B]``, or at the rows listed by ``rows`` (``[B]`` int64). One kernel: it reads x twice
    (the maximum, then the values), where ``quantize`` and a copy take several passes and a
    float32 copy of x."""
    b, h, t, d = x.shape
    if dst.shape[1:] != x.shape[1:] or dst.shape[0] < b or scale.shape != dst.shape[:2] or x.stride(3) != 1 \
            or dst.stride(3) != 1 or dst.dtype != torch.float8_e4m3fn or (rows is not None and rows.shape != (b,)):
        raise ValueError(f"quantize_into: x {tuple(x.shape)} does not fit the FP8 cache {tuple(dst.shape)} "
                         f"({dst.dtype}) and scales {tuple(scale.shape)}")
    _check_scales("quantize_into", dst, scale)
    if d & (d - 1) or (rows is not None and rows.dtype != torch.int64):
        raise ValueError(f"quantize_into: the head size must be a power of two (got {d}) and rows int64 "
                         f"(got {None if rows is None else rows.dtype})")
    if not x.is_cuda:
        # Triton's interpreter (CPU tensors) rounds float32 to E4M3 down where it should round up to
        # a power of two (124.5 -> 64, Triton 3.7) or among the subnormals, so there PyTorch rounds.
        x8, s = quantize(x)
        if rows is None:
            dst[:b].copy_(x8)
            scale[:b].copy_(s)
        else:  # index_copy_ has no FP8 kernel: copy the bytes
            dst.view(torch.uint8).index_copy_(0, rows, x8.view(torch.uint8))
            scale.index_copy_(0, rows, s)
        return
    _quantize_into_kernel[(b * h,)](
        x, dst, scale, rows if rows is not None else scale, h, t,
        x.stride(0), x.stride(1), x.stride(2), dst.stride(0), dst.stride(1), dst.stride(2), scale.stride(0),
        D=d, BLOCK_T=64, HAS_ROWS=rows is not None, num_warps=4)


@triton.jit
def _online_block(k_base, v_base, k_st, v_st, t0, stop, d, q, m, denom, acc, BLOCK_T: tl.constexpr):
    """One block of positions ``t0 .. t0 + BLOCK_T`` (those < ``stop``) of one query's attention
    with an online softmax (Milakov & Gimelshein 2018, as FlashAttention): ``q [D]`` float32 with
    every scale folded in, keys and values at ``base + t * stride + d``; returns the running max
    ``m``, denominator and unnormalised sum ``acc [D]`` updated."""
    t = t0 + tl.arange(0, BLOCK_T)
    valid = t < stop
    kb = tl.load(k_base + t[:, None] * k_st + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    s = tl.where(valid, tl.sum(kb * q[None, :], axis=1), float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=0))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new)
    vb = tl.load(v_base + t[:, None] * v_st + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    return m_new, denom * alpha + tl.sum(p, axis=0), acc * alpha + tl.sum(p[:, None] * vb, axis=0)


@triton.jit
def _attend_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, out_ptr, part_ptr,
                   H, T, sm_scale,
                   q_sb, q_sh, k_sb, k_sh, k_st, v_sb, v_sh, v_st, s_sb, o_sb, o_sh,
                   D: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr):
    bh = tl.program_id(0)
    part = tl.program_id(1)
    b = bh // H
    h = bh % H
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * q_sb + h * q_sh + d).to(tl.float32)
    k_scale = tl.load(ks_ptr + b * s_sb + h)
    v_scale = tl.load(vs_ptr + b * s_sb + h)
    qs = q * (k_scale * sm_scale)  # the key's scale and 1/sqrt(D) folded into the query
    per_part = tl.cdiv(T, SPLIT)
    start = part * per_part
    stop = tl.minimum(start + per_part, T)
    m = tl.full((), float("-inf"), tl.float32)
    denom = tl.zeros((), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    k_base = k_ptr + b * k_sb + h * k_sh
    v_base = v_ptr + b * v_sb + h * v_sh
    for t0 in range(start, stop, BLOCK_T):
        m, denom, acc = _online_block(k_base, v_base, k_st, v_st, t0, stop, d, qs, m, denom, acc, BLOCK_T)
    if SPLIT == 1:
        tl.store(out_ptr + b * o_sb + h * o_sh + d, (acc * (v_scale / denom)).to(out_ptr.dtype.element_ty))
    else:
        # partial results [B*H, SPLIT, D + 2]: the unnormalised sum (already scaled by v), max, denominator
        base = part_ptr + (bh * SPLIT + part) * (D + 2)
        tl.store(base + d, acc * v_scale)
        tl.store(base + D, m)
        tl.store(base + D + 1, denom)


@triton.jit
def _self_attend_kernel(q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, pos_ptr, out_ptr, H, sm_scale,
                        q_sb, k_sb, v_sb, c_sb, c_sh, c_st, o_sb,
                        D: tl.constexpr, BLOCK_T: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    d = tl.arange(0, D)
    pos = tl.load(pos_ptr + b)
    q = tl.load(q_ptr + b * q_sb + h * D + d).to(tl.float32) * sm_scale
    k_new = tl.load(k_ptr + b * k_sb + h * D + d)
    v_new = tl.load(v_ptr + b * v_sb + h * D + d)
    kc = kc_ptr + b * c_sb + h * c_sh
    vc = vc_ptr + b * c_sb + h * c_sh
    tl.store(kc + pos * c_st + d, k_new.to(kc_ptr.dtype.element_ty))
    tl.store(vc + pos * c_st + d, v_new.to(vc_ptr.dtype.element_ty))
    # this position from registers (the store above need not be visible to this program yet) ...
    m = tl.sum(q * k_new.to(tl.float32), axis=0)
    denom = tl.full((), 1.0, tl.float32)
    acc = v_new.to(tl.float32)
    # ... and the positions before it from the cache
    for t0 in range(0, pos, BLOCK_T):
        m, denom, acc = _online_block(kc, vc, c_st, c_st, t0, pos, d, q, m, denom, acc, BLOCK_T)
    tl.store(out_ptr + b * o_sb + h * D + d, (acc / denom).to(out_ptr.dtype.element_ty))


def self_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                positions: torch.Tensor, block_t: int | None = None, num_warps: int = 4) -> torch.Tensor:
    """A decoder step's self-attention in one kernel: writes ``k``, ``v`` (``[B, H, D]``, this
    step's keys and values; rows may be strided, the last two dimensions contiguous) into
    ``k_cache``/``v_cache`` (``[max_batch, H, T, D]``, contiguous) at each row's ``positions``
    (``[B]`` int64, each < T) and returns ``[B, H, D]`` in q's dtype: ``q [B, H, D]``'s attention
    over positions ``0..positions[b]`` of its row, each row reading only its own length (where
    PyTorch's kernels read a padded span under a mask, after two scatters). Static shapes, no
    host synchronisation: safe inside a CUDA graph."""
    b, h, d = q.shape
    if k.shape != q.shape or v.shape != q.shape or k_cache.shape[0] < b or k_cache.shape[1] != h \
            or k_cache.shape[3] != d or v_cache.shape != k_cache.shape or not k_cache.is_contiguous() \
            or not v_cache.is_contiguous():
        raise ValueError(f"self_attend: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match the "
                         f"contiguous caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    if d & (d - 1) or d < 16:
        raise ValueError(f"self_attend: the head size must be a power of two >= 16, got {d}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(2) != 1 or x.stride(1) != d:
            raise ValueError(f"self_attend: {name}'s heads must be contiguous ([B, H, D] rows of H x D values)")
    out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    _self_attend_kernel[(b * h,)](
        q, k, v, k_cache, v_cache, positions, out, h, d ** -0.5,
        q.stride(0), k.stride(0), v.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), out.stride(0),
        D=d, BLOCK_T=block_t or (32 if q.is_cuda else 512), num_warps=num_warps)
    return out


def attend(q: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
           split: int = 1, block_t: int | None = None, num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """See the module doc. Static shapes and no host synchronisation: safe inside a CUDA graph.
    ``block_t``: positions per loop iteration of a program (a power of two; default 256 on CUDA:
    over a large-v3 step's 32 layers on an H100, 4 warps, 3 stages, 2.92 ms at batch 64 and 5.27 at
    128, against 2.95 and 5.67 with 128 and cuDNN's 5.13 and 10.03 on bf16, ``bench/gpu_fp8_tune.py``,
    2026-12-05, ``bench/results/gpu_fp8_tune_h100.json``; and 512 on CPU tensors, where Triton's
    interpreter runs each iteration in Python)."""
    b, h, d = q.shape
    if k8.shape[0] < b or k8.shape[1] != h or k8.shape[3] != d or v8.shape[:4] != k8.shape[:4]:
        raise ValueError(f"attend: q {tuple(q.shape)} does not match k {tuple(k8.shape)} / v {tuple(v8.shape)}")
    if d & (d - 1) or d < 16:
        raise ValueError(f"attend: the head size must be a power of two >= 16, got {d}")
    if k8.stride(3) != 1 or v8.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError("attend: the last dimension of q, k and v must be contiguous")
    _check_scales("attend", k8, k_scale, v_scale)
    block_t = block_t or (256 if q.is_cuda else 512)
    if split < 1 or block_t & (block_t - 1):
        raise ValueError(f"attend: split must be >= 1 and block_t a power of two, got {split} and {block_t}")
    t = k8.shape[2]
    out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    part = torch.empty((b * h, split, d + 2), dtype=torch.float32, device=q.device) if split > 1 else out
    _attend_kernel[(b * h, split)](
        q, k8, v8, k_scale, v_scale, out, part, h, t, d ** -0.5,
        q.stride(0), q.stride(1), k8.stride(0), k8.stride(1), k8.stride(2), v8.stride(0), v8.stride(1), v8.stride(2),
        k_scale.stride(0), out.stride(0), out.stride(1),
        D=d, BLOCK_T=block_t, SPLIT=split, num_warps=num_warps, num_stages=num_stages)
    if split == 1:
        return out
    acc, m, denom = part[..., :d], part[..., d], part[..., d + 1]  # [BH, S, D], [BH, S], [BH, S]
    w = torch.exp(m - m.amax(dim=1, keepdim=True))  # each part's weight against the largest max
    o = (acc * w[..., None]).sum(dim=1) / (denom * w).sum(dim=1)[:, None]
    return o.view(b, h, d).to(q.dtype)


# Under torch.compile (the decoder's compiled step, ``decode.GreedyDecoder``) the two decoder-step kernels are custom operators,
# opaque to Inductor: traced through, Triton then compiled the self-attention kernel with a
# float64 scale (its loop-carried sum changed type and the build failed, H100, torch 2.11).
# ``model.Whisper.step`` calls these only while compiling; eagerly it calls the functions above
# (an operator's dispatch would add its own cost to each of a step's 64 calls).


@torch.library.custom_op("tideserve::self_attend", mutates_args=("k_cache", "v_cache"))
def self_attend_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   positions: torch.Tensor) -> torch.Tensor:
    """``self_attend`` as a custom operator (writes ``k_cache``/``v_cache``)."""
    return self_attend(q, k, v, k_cache, v_cache, positions)


@self_attend_op.register_fake
def _self_attend_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return q.new_empty(q.shape)


@torch.library.custom_op("tideserve::attend", mutates_args=())
def attend_op(q: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, k_scale: torch.Tensor,
              v_scale: torch.Tensor) -> torch.Tensor:
    """``attend`` (its defaults) as a custom operator."""
    return attend(q, k8, v8, k_scale, v_scale)


@attend_op.register_fake
def _attend_shape(q: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, k_scale: torch.Tensor,
                  v_scale: torch.Tensor) -> torch.Tensor:
    return q.new_empty(q.shape)
