"""Cross-attention over the encoder's output with the key and value projections absorbed: an
experiment (2026-12-07), not served; ``bench/gpu_absorbed_attend.py`` measures it against the
served FP8 keys and values (``torch_whisper.triton_kernels.attend``).

Two kernels for the same result:

- ``absorbed_attend``: each program takes 16 or 32 heads of one row; the
  products run with the heads as rows (``[heads, positions]`` scores), E's chunks converted to
  qa's dtype and held from the scores to the output product.
- ``absorbed_attend_positions``: the positions as rows (``[positions, heads]`` scores, the output
  as ``[width, heads]``), so each product has 64 or more rows (Hopper's warp-group products need
  them); E read again for the output product instead of held.

Measured on an H100 (``bench/results/gpu_absorbed_attend_h100.json``): both are three to six
times slower than the served ``attend`` over FP8 keys and values, which reads twice the bytes:
these kernels are bound by their work (E converted to bf16 for the tensor cores, 20 heads padded
to 32, each product's operands laid out anew), not by the bytes they read. A version that took
the scores' product on the FP8 values straight (qa quantized per head) stopped with an illegal
memory access on its first run and was removed uninvestigated.

Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import torch

import triton
import triton.language as tl

E4M3_MAX = 448.0


# Every decoder layer's cross-attention keys and values are projections of one tensor, the
# encoder's output E [T, D] (k = E W_k,h^T, v = E W_v,h^T + b_v,h per head h; Whisper's k_proj
# has no bias). So q_h k^T = (q_h W_k,h) E^T and p v = (p E) W_v,h^T + b_v,h (p sums to 1): a step
# can attend over E itself with the projections moved to the query and the output, as DeepSeek-V2's
# multi-head latent attention absorbs its up-projections (Liu et al. 2024, section 2.1.3; vLLM's
# MLA decode path does the same). One E in FP8 per window then serves all layers and heads: D
# bytes per position read per layer, against 2 x D for FP8 keys and values, and the cache is one
# [T, D] per row instead of 2 x layers of them.


def quantize_positions(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [B, T, D]`` -> ``(x8 [B, T, D] float8_e4m3fn, scale [B, T] float32)`` with ``x ~= x8 *
    scale[..., None]``: one scale per position, ``amax(|x[b, t]|) / 448``, never 0."""
    if x.dim() != 3:
        raise ValueError(f"quantize_positions takes [B, T, D], got shape {tuple(x.shape)}")
    scale = torch.clamp(x.abs().amax(dim=2).float() / E4M3_MAX, min=1e-12)
    return (x.float() / scale[:, :, None]).to(torch.float8_e4m3fn), scale


@triton.jit
def _absorbed_block(q_base, e_base, t, tv, dc, hv, e_st, c: tl.constexpr, DC: tl.constexpr, s):
    """Chunk ``c`` (columns ``c*DC .. c*DC+DC``) of a block's scores: returns the chunk of E
    ``[BLOCK_T, DC]`` in q's dtype and ``s + q_c e_c^T``."""
    e = tl.load(e_base + t[:, None] * e_st + c * DC + dc[None, :], mask=tv[:, None], other=0.0)
    e = e.to(q_base.dtype.element_ty)
    q = tl.load(q_base + c * DC + dc[None, :], mask=hv[:, None], other=0.0)
    return e, s + tl.dot(q, tl.trans(e))


@triton.jit
def _absorbed_attend_kernel(q_ptr, e_ptr, es_ptr, out_ptr, part_ptr, H, T, sm_scale,
                            q_sb, q_sh, e_sb, e_st, es_sb, o_sb, o_sh,
                            HB: tl.constexpr, DC: tl.constexpr, NC: tl.constexpr,
                            BLOCK_T: tl.constexpr, SPLIT: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    part = tl.program_id(2)
    hv = h < H
    dc = tl.arange(0, DC)
    per_part = tl.cdiv(T, SPLIT)
    start = part * per_part
    stop = tl.minimum(start + per_part, T)
    q_base = q_ptr + b * q_sb + h[:, None] * q_sh
    e_base = e_ptr + b * e_sb
    m = tl.full((HB,), float("-inf"), tl.float32)
    denom = tl.zeros((HB,), tl.float32)
    acc0 = tl.zeros((HB, DC), tl.float32)
    acc1 = tl.zeros((HB, DC), tl.float32)
    acc2 = tl.zeros((HB, DC), tl.float32)
    acc3 = tl.zeros((HB, DC), tl.float32)
    acc4 = tl.zeros((HB, DC), tl.float32)
    for t0 in range(start, stop, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tv = t < stop
        s = tl.zeros((HB, BLOCK_T), tl.float32)
        e0, s = _absorbed_block(q_base, e_base, t, tv, dc, hv, e_st, 0, DC, s)
        if NC > 1:
            e1, s = _absorbed_block(q_base, e_base, t, tv, dc, hv, e_st, 1, DC, s)
        if NC > 2:
            e2, s = _absorbed_block(q_base, e_base, t, tv, dc, hv, e_st, 2, DC, s)
        if NC > 3:
            e3, s = _absorbed_block(q_base, e_base, t, tv, dc, hv, e_st, 3, DC, s)
        if NC > 4:
            e4, s = _absorbed_block(q_base, e_base, t, tv, dc, hv, e_st, 4, DC, s)
        es = tl.load(es_ptr + b * es_sb + t, mask=tv, other=0.0)
        s = tl.where(tv[None, :], s * (es * sm_scale)[None, :], float("-inf"))  # log2 units
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        pv = (p * es[None, :]).to(q_ptr.dtype.element_ty)  # the positions' scales folded into p
        acc0 = acc0 * alpha[:, None] + tl.dot(pv, e0)
        if NC > 1:
            acc1 = acc1 * alpha[:, None] + tl.dot(pv, e1)
        if NC > 2:
            acc2 = acc2 * alpha[:, None] + tl.dot(pv, e2)
        if NC > 3:
            acc3 = acc3 * alpha[:, None] + tl.dot(pv, e3)
        if NC > 4:
            acc4 = acc4 * alpha[:, None] + tl.dot(pv, e4)
        m = m_new
    if SPLIT == 1:
        o = out_ptr + b * o_sb + h[:, None] * o_sh + dc[None, :]
        inv = 1.0 / denom[:, None]
        ty = out_ptr.dtype.element_ty
        tl.store(o, (acc0 * inv).to(ty), mask=hv[:, None])
        if NC > 1:
            tl.store(o + DC, (acc1 * inv).to(ty), mask=hv[:, None])
        if NC > 2:
            tl.store(o + 2 * DC, (acc2 * inv).to(ty), mask=hv[:, None])
        if NC > 3:
            tl.store(o + 3 * DC, (acc3 * inv).to(ty), mask=hv[:, None])
        if NC > 4:
            tl.store(o + 4 * DC, (acc4 * inv).to(ty), mask=hv[:, None])
    else:
        # partials [B, H, SPLIT, NC * DC + 2]: the unnormalised sum, max (log2 units), denominator
        width = NC * DC + 2
        base = part_ptr + ((b * H + h[:, None]) * SPLIT + part) * width + dc[None, :]
        tl.store(base, acc0, mask=hv[:, None])
        if NC > 1:
            tl.store(base + DC, acc1, mask=hv[:, None])
        if NC > 2:
            tl.store(base + 2 * DC, acc2, mask=hv[:, None])
        if NC > 3:
            tl.store(base + 3 * DC, acc3, mask=hv[:, None])
        if NC > 4:
            tl.store(base + 4 * DC, acc4, mask=hv[:, None])
        stats = part_ptr + ((b * H + h) * SPLIT + part) * width + NC * DC
        tl.store(stats, m, mask=hv)
        tl.store(stats + 1, denom, mask=hv)


def absorbed_chunks(d: int) -> tuple[int, int]:
    """``(DC, NC)``: E's width ``d`` as ``NC`` (1-5) chunks of ``DC`` (a power of two, 16-256)
    columns, the widest such chunks; ValueError if there are none (Whisper's widths: 384 = 3 x 128,
    512 = 2 x 256, 768 = 3 x 256, 1024 = 4 x 256, 1280 = 5 x 256)."""
    for dc in (256, 128, 64, 32, 16):
        if d % dc == 0 and d // dc <= 5:
            return dc, d // dc
    raise ValueError(f"absorbed_attend: the model width {d} is not 1-5 chunks of 16-256 columns (a power of two)")


def _check(qa: torch.Tensor, e8: torch.Tensor, e_scale: torch.Tensor) -> tuple[int, int, int]:
    """``qa``'s ``(B, H, D)`` once ``qa``, ``e8`` and ``e_scale`` fit ``absorbed_attend``; else ValueError."""
    b, h, d = qa.shape
    if e8.dim() != 3 or e8.shape[0] < b or e8.shape[2] != d or e8.dtype != torch.float8_e4m3fn or e8.stride(2) != 1:
        raise ValueError(f"absorbed_attend: qa {tuple(qa.shape)} does not match E {tuple(e8.shape)} ({e8.dtype}; "
                         "float8_e4m3fn [B, T, D] with contiguous rows needed)")
    if e_scale.shape != e8.shape[:2] or e_scale.dtype != torch.float32 or e_scale.stride(1) != 1 \
            or qa.stride(2) != 1:
        raise ValueError(f"absorbed_attend: scales must be float32 {tuple(e8.shape[:2])} with contiguous rows "
                         f"(got {e_scale.dtype} {tuple(e_scale.shape)}), and qa's last dimension contiguous")
    return b, h, d


def absorbed_attend(qa: torch.Tensor, e8: torch.Tensor, e_scale: torch.Tensor, head_dim: int, split: int = 1,
                    block_t: int | None = None, heads_per_program: int = 16, num_warps: int = 8,
                    num_stages: int = 1) -> torch.Tensor:
    """Attention of one decoder position over the encoder's output with the key and value
    projections absorbed (see above): ``qa [B, H, D]`` (each head's query times its key
    projection, ``q_h W_k,h``; D the model width; its last dimension contiguous) over ``e8 [>=B,
    T, D]`` (float8_e4m3fn, E's first B rows may be a view of a larger cache) with ``e_scale
    [>=B, T]`` (float32, contiguous rows; E ~= e8 * e_scale) -> ``u [B, H, D]`` in qa's dtype,
    ``softmax(qa E^T / sqrt(head_dim)) E`` per row and head; the caller applies the value
    projection (``u_h W_v,h^T + b_v,h``). Products on the tensor cores in qa's dtype with float32
    sums. ``split`` cuts T into parts, each a program, combined after (more programs when B is
    small). Static shapes, no host synchronisation: safe inside a CUDA graph. ValueError for
    shapes, strides or dtypes it does not take."""
    b, h, d = _check(qa, e8, e_scale)
    dc, nc = absorbed_chunks(d)
    block_t = block_t or (32 if qa.is_cuda else 512)
    hb = heads_per_program
    if split < 1 or block_t & (block_t - 1) or block_t < 16 or hb & (hb - 1) or hb < 16:
        raise ValueError(f"absorbed_attend: split >= 1, block_t and heads_per_program powers of two >= 16 "
                         f"(got {split}, {block_t}, {hb})")
    t = e8.shape[1]
    if split > 1:  # the kernel writes partials; ``out`` is only its unused pointer then
        part = out = torch.empty((b, h, split, d + 2), dtype=torch.float32, device=qa.device)
    else:
        part = out = torch.empty((b, h, d), dtype=qa.dtype, device=qa.device)
    sm_scale = head_dim ** -0.5 * 1.4426950408889634  # 1/sqrt(head_dim) and log2(e): exp2 in the kernel
    _absorbed_attend_kernel[(b, triton.cdiv(h, hb), split)](
        qa, e8, e_scale, out, part, h, t, sm_scale,
        qa.stride(0), qa.stride(1), e8.stride(0), e8.stride(1), e_scale.stride(0), out.stride(0), out.stride(1),
        HB=hb, DC=dc, NC=nc, BLOCK_T=block_t, SPLIT=split, num_warps=num_warps, num_stages=num_stages)
    if split == 1:
        return out
    acc, m, denom = part[..., :d], part[..., d], part[..., d + 1]  # [B, H, S, D], [B, H, S], [B, H, S]
    w = torch.exp2(m - m.amax(dim=2, keepdim=True))
    return ((acc * w[..., None]).sum(dim=2) / (denom * w).sum(dim=2)[..., None]).to(qa.dtype)


@triton.jit
def _positions_scores(e_base, q_base, t, tv, dc, hv, e_st, c: tl.constexpr, DC: tl.constexpr, s_t):
    e = tl.load(e_base + t[:, None] * e_st + c * DC + dc[None, :], mask=tv[:, None], other=0.0)  # [BLOCK_T, DC]
    q = tl.load(q_base + c * DC + dc[None, :], mask=hv[:, None], other=0.0)                      # [HB, DC]
    return s_t + tl.dot(e.to(q.dtype), tl.trans(q))


@triton.jit
def _positions_output(e_base, t, tv, dc, e_st, c: tl.constexpr, DC: tl.constexpr, p_t, acc_t, alpha):
    e = tl.load(e_base + t[:, None] * e_st + c * DC + dc[None, :], mask=tv[:, None], other=0.0).to(p_t.dtype)
    return acc_t * alpha[None, :] + tl.dot(tl.trans(e), p_t)  # [DC, BLOCK_T] x [BLOCK_T, HB]


@triton.jit
def _positions_kernel(q_ptr, e_ptr, es_ptr, out_ptr, H, T, sm_scale,
                      q_sb, q_sh, e_sb, e_st, es_sb, o_sb, o_sh,
                      HB: tl.constexpr, DC: tl.constexpr, NC: tl.constexpr, BLOCK_T: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    hv = h < H
    dc = tl.arange(0, DC)
    q_base = q_ptr + b * q_sb + h[:, None] * q_sh
    e_base = e_ptr + b * e_sb
    ty = out_ptr.dtype.element_ty
    m = tl.full((HB,), float("-inf"), tl.float32)
    denom = tl.zeros((HB,), tl.float32)
    acc0 = tl.zeros((DC, HB), tl.float32)
    acc1 = tl.zeros((DC, HB), tl.float32)
    acc2 = tl.zeros((DC, HB), tl.float32)
    acc3 = tl.zeros((DC, HB), tl.float32)
    acc4 = tl.zeros((DC, HB), tl.float32)
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tv = t < T
        s_t = tl.zeros((BLOCK_T, HB), tl.float32)
        s_t = _positions_scores(e_base, q_base, t, tv, dc, hv, e_st, 0, DC, s_t)
        if NC > 1:
            s_t = _positions_scores(e_base, q_base, t, tv, dc, hv, e_st, 1, DC, s_t)
        if NC > 2:
            s_t = _positions_scores(e_base, q_base, t, tv, dc, hv, e_st, 2, DC, s_t)
        if NC > 3:
            s_t = _positions_scores(e_base, q_base, t, tv, dc, hv, e_st, 3, DC, s_t)
        if NC > 4:
            s_t = _positions_scores(e_base, q_base, t, tv, dc, hv, e_st, 4, DC, s_t)
        es = tl.load(es_ptr + b * es_sb + t, mask=tv, other=0.0)
        s_t = tl.where(tv[:, None], s_t * (es * sm_scale)[:, None], float("-inf"))  # log2 units
        m_new = tl.maximum(m, tl.max(s_t, axis=0))
        alpha = tl.exp2(m - m_new)
        p_t = tl.exp2(s_t - m_new[None, :])
        denom = denom * alpha + tl.sum(p_t, axis=0)
        p_t = (p_t * es[:, None]).to(ty)
        acc0 = _positions_output(e_base, t, tv, dc, e_st, 0, DC, p_t, acc0, alpha)
        if NC > 1:
            acc1 = _positions_output(e_base, t, tv, dc, e_st, 1, DC, p_t, acc1, alpha)
        if NC > 2:
            acc2 = _positions_output(e_base, t, tv, dc, e_st, 2, DC, p_t, acc2, alpha)
        if NC > 3:
            acc3 = _positions_output(e_base, t, tv, dc, e_st, 3, DC, p_t, acc3, alpha)
        if NC > 4:
            acc4 = _positions_output(e_base, t, tv, dc, e_st, 4, DC, p_t, acc4, alpha)
        m = m_new
    o = out_ptr + b * o_sb + h[None, :] * o_sh + dc[:, None]  # [DC, HB]
    inv = 1.0 / denom[None, :]
    tl.store(o, (acc0 * inv).to(ty), mask=hv[None, :])
    if NC > 1:
        tl.store(o + DC, (acc1 * inv).to(ty), mask=hv[None, :])
    if NC > 2:
        tl.store(o + 2 * DC, (acc2 * inv).to(ty), mask=hv[None, :])
    if NC > 3:
        tl.store(o + 3 * DC, (acc3 * inv).to(ty), mask=hv[None, :])
    if NC > 4:
        tl.store(o + 4 * DC, (acc4 * inv).to(ty), mask=hv[None, :])


def absorbed_attend_positions(qa: torch.Tensor, e8: torch.Tensor, e_scale: torch.Tensor, head_dim: int,
                              block_t: int = 64, heads_per_program: int = 32, num_warps: int = 8,
                              num_stages: int = 1) -> torch.Tensor:
    """``absorbed_attend``'s result by the ``positions`` kernel (module doc); the same arguments."""
    b, h, d = _check(qa, e8, e_scale)
    dc, nc = absorbed_chunks(d)
    out = torch.empty((b, h, d), dtype=qa.dtype, device=qa.device)
    sm_scale = head_dim ** -0.5 * 1.4426950408889634
    _positions_kernel[(b, triton.cdiv(h, heads_per_program))](
        qa, e8, e_scale, out, h, e8.shape[1], sm_scale,
        qa.stride(0), qa.stride(1), e8.stride(0), e8.stride(1), e_scale.stride(0), out.stride(0), out.stride(1),
        HB=heads_per_program, DC=dc, NC=nc, BLOCK_T=block_t, num_warps=num_warps, num_stages=num_stages)
    return out
