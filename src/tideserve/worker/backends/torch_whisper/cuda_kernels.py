"""The torch backend's CUDA kernel (the only module that compiles CUDA C: one adapter for NVRTC):
the decoder's cross-attention over one FP8 copy of the encoder's output, with each layer's key
and value projections absorbed into the query and the output.

Why. Every decoder layer's cross-attention keys and values are projections of one tensor, the
encoder's output E ``[T, D]`` (``k = E W_k,h^T`` and ``v = E W_v,h^T + b_v,h`` per head h;
Whisper's k_proj has no bias). So ``q_h k^T = (q_h W_k,h) E^T`` and ``p v = (p E) W_v,h^T +
b_v,h`` (p sums to 1): a step can attend over E itself, with the projections moved to the query
and the output, as DeepSeek-V2's multi-head latent attention absorbs its up-projections (Liu et
al. 2024, section 2.1.3; vLLM's MLA decode path does the same). One FP8 E a window then serves
every layer and head: D bytes a position read per layer, against 2 x D for the FP8 keys and
values of ``triton_kernels.attend``, and the cache holds one ``[T, D]`` a row instead of 2 x
layers of ``[H, T, D / H]``. At large-v3 size that reading is most of a decoder step.

How. The two products both run on FP8 tensor cores (``mma.sync.m16n8k32`` over e4m3, sm_89 and
later; from width 768 a block's shared memory is more than sm_89 and sm_120 GPUs give, so those
widths need an H100 or H200). Hopper's FP8 products want both operands K-major, and E is K-major for only one of them
(the scores ``S^T = E qa^T`` sum over the width, the output ``u^T = E^T P^T`` over the
positions); the Triton versions of 2026-12-07 converted E to bf16 instead and were bound by that
work (``bench/absorbed_attention.py``). Here the output product's operand comes from the same
shared-memory block through ``ldmatrix.trans`` (E's bytes two at a time, as 16-bit values) and a
byte permutation (``prmt``) per register, as FlashAttention-3 transposes FP8 values (Shah et al.
2024, section 3.3); any order of the positions inside a block serves the output product as long
as the probabilities P are laid out in the same order, so that order is written into P's
shared-memory layout.

One program (256 threads, 8 warps) per row and part of the positions (``split``); per block of 64
positions, E's block double-buffered in shared memory by ``cp.async``:

1. scores ``[64 positions, heads]`` (heads padded to tiles of 8): warp w takes 16 positions
   (w % 4) and half of the width (w // 4), qa's FP8 copy held in shared memory (quantized there
   per head, ``amax / 448``); the two halves summed through shared memory;
2. online softmax per head (exp2), ``p * e_scale[t] * 448 / max(e_scale)`` to e4m3;
3. output ``[width, heads]``: warp w takes the width's groups of 32 columns w, w + 8, ...; at
   large-v3 size its 30 accumulator tiles (120 float registers) are held across the blocks and
   rescaled per head.

qa and P are e4m3 in the products, where ``triton_kernels.attend`` takes bf16 queries and float32
probabilities. Compiled at first use by NVRTC through PyTorch (``torch.cuda._compile_kernel``) for
the GPU at hand; no CPU path.

On sm_90 (H100, H200) ``mma.sync`` over e4m3 is not an FP8 product: its SASS converts both
operands to f16 and runs two f16 products (Nsight Compute, README Serving path (19)). A second
kernel, ``absorbed_wgmma`` (the build ``WGMMA``, compiled for sm_90a), runs both products as
Hopper's warp-group products over e4m3: the scores with E's block and qa in shared memory laid
out as the products read them (8 rows x 16 bytes contiguous, "core matrices", no swizzle), the
output with E's transposed fragments in registers (as above) and P in shared
memory; each of its two warp groups takes half the width. So built, it read E at about half the
H100's bandwidth (1.7 TB/s, README, Serving path (22)): its cp.async loads of 64 bytes a row
(into that unswizzled layout) were the limit. Two builds change only how E's blocks come in:
``WG_SW128`` reads whole 128-byte lines (512 contiguous bytes a warp) into the 128-byte swizzle
that the products' descriptors and ``ldmatrix`` then read, and ``WG_TMA`` has one thread issue
Hopper's tensor copies (``cp.async.bulk.tensor`` over ``tensor_map(e8)``, completing on an
mbarrier a stage), which write that swizzle themselves. Both read 2.6 TB/s (README, Serving path
(23)); ``WGMMA,WG_TMA`` is the default on sm_90 (``default_build``). ``WG_LOADS_ONLY``
(diagnostic) keeps only the loads.

- ``quantize_positions_into(x, e8, scale, rows)``: ``x [B, T, D]`` into FP8 cache rows with one
  scale a position, ``amax(|x[b, t]|) / 448``, never 0.
- ``absorbed_attend(qa, e8, e_scale, head_dim, split)``: ``qa [B, H, D]`` (``q_h W_k,h``) over
  ``e8 [>=B, T, D]`` -> ``u [B, H, D]`` bf16, ``softmax(qa E^T / sqrt(head_dim)) E``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

E4M3_MAX = 448.0
BUILD_ENV = "TIDESERVE_ABSORBED_BUILD"
# the builds the served path may run: the mma.sync kernel (""), the warp-group kernel (sm_90)
SERVED_BUILDS = ("", "WGMMA", "WGMMA,WG_PROMOTE", "WGMMA,WG_SW128", "WGMMA,WG_TMA")
BLOCK_T = 64
# E's and qa's rows in shared memory are D + 16 bytes apart (D a multiple of 64): the eight rows of
# one ldmatrix then fall in eight distinct quads of banks

# helpers and sizes of both kernels
_HELPERS = r"""
#define BT 64
#define ROWB (D + 16)
#define NG (D / 32)
#define GPW ((NG + 7) / 8)
#define KS1 (D / 64)
#define RS 68
#define PS 80
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void cp_wait0() { asm volatile("cp.async.wait_group 0;\n" ::); }

#if defined(BULK_COPY) || defined(WG_TMA)  // E's blocks by bulk or tensor copies (sm_90) completing on an mbarrier
__device__ __forceinline__ void mbar_init(unsigned bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(bar));
}
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile("{\n.reg .pred P1;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               "@!P1 bra WAIT;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
#endif
__device__ __forceinline__ void ldsm4(unsigned a, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}
__device__ __forceinline__ void ldsm4t(unsigned a, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}
__device__ __forceinline__ void mma8(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                     unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned char to_e4m3(float x) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(0.0f), "f"(x));
  return (unsigned char)(r & 0xff);
}
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// position p (0..31) of a 32-position step -> its index k in the output product's K order:
// ldmatrix.trans gives a thread positions (2t, 2t+1) of rows 0-7 and 8-15, and prmt puts
// (2t, 2t+1, 8+2t, 9+2t) at k = 4t .. 4t+3 (and the same 16 further for positions 16-31)
__device__ __forceinline__ int k_of(int p) {
  int h2 = p >> 4, q = p & 15;
  return q < 8 ? 16 * h2 + 4 * (q >> 1) + (q & 1) : 16 * h2 + 4 * ((q - 8) >> 1) + 2 + (q & 1);
}


// E's largest position scale (P is stored as p * e_scale[t] * 448 / that): each warp's into
// wred[warp], for the block to take the largest of after a barrier
__device__ __forceinline__ void row_scale_max(const float* es_row, int T, float* wred, int tid, int lane, int warp) {
  float em = 0.0f;
#pragma unroll 4
  for (int i = tid; i < T; i += 256) em = fmaxf(em, es_row[i]);
  for (int o = 16; o; o >>= 1) em = fmaxf(em, __shfl_xor_sync(0xffffffff, em, o));
  if (lane == 0) wred[warp] = em;
}
// qa's FP8 copy, one scale a head (amax / 448, never 0), qsc_s[h] = that scale x sm_log2; heads
// H..HP-1 zero. Warp w takes heads w, w + 8, w + 16; lane l the 8 values at 8 (l + 32 i), i < D /
// 256; off(h, k): the byte of head h's value k in qs (each kernel lays qs out its own way)
template <typename Off>
__device__ __forceinline__ void quantize_qa(const unsigned short* qa_row, int q_sh, int H, unsigned char* qs,
                                            float* qsc_s, float sm_log2, int warp, int lane, Off off) {
  for (int h = warp; h < HP; h += 8) {
    if (h < H) {
      const uint4* src = (const uint4*)(qa_row + (long long)h * q_sh);
      float am = 0.0f;
      for (int c = lane; c < D / 8; c += 32) {
        const uint4 v = src[c];
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k)
          am = fmaxf(am, fmaxf(fabsf(__uint_as_float(w[k] << 16)), fabsf(__uint_as_float(w[k] & 0xffff0000u))));
      }
      for (int o = 16; o; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffff, am, o));
      const float sc = fmaxf(am / 448.0f, 1e-12f), inv = 1.0f / sc;
      for (int c = lane; c < D / 8; c += 32) {
        const uint4 v = src[c];
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
        unsigned short pr[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
          asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pr[k])
              : "f"(__uint_as_float(w[k] & 0xffff0000u) * inv), "f"(__uint_as_float(w[k] << 16) * inv));
        *(uint2*)(qs + off(h, 8 * c)) = make_uint2((unsigned)pr[0] | ((unsigned)pr[1] << 16), (unsigned)pr[2] | ((unsigned)pr[3] << 16));
      }
      if (lane == 0) qsc_s[h] = sc * sm_log2;
    } else {
      for (int c = lane; c < D / 8; c += 32) *(uint2*)(qs + off(h, 8 * c)) = make_uint2(0u, 0u);
      if (lane == 0) qsc_s[h] = 0.0f;
    }
  }
}
// a warp's partial scores (accumulator layout: rows = positions p_tile * 16 + g (+ 8), columns =
// heads 8 n + 2 t (+ 1)) into rd [HP][RS]
__device__ __forceinline__ void store_scores(const float (&c)[NT][4], float* rd, int p_tile, int g, int t) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int h0 = n * 8 + 2 * t, p0 = p_tile * 16 + g;
    rd[h0 * RS + p0] = c[n][0];
    rd[(h0 + 1) * RS + p0] = c[n][1];
    rd[h0 * RS + p0 + 8] = c[n][2];
    rd[(h0 + 1) * RS + p0 + 8] = c[n][3];
  }
}
// the output accumulators (columns = heads 8 n + 2 t (+ 1)) times each head's alpha
template <int M>
__device__ __forceinline__ void rescale(float (&acc)[M][NT][4], const float* alpha, int t) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const float a_lo = alpha[n * 8 + 2 * t], a_hi = alpha[n * 8 + 2 * t + 1];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      acc[m][n][0] *= a_lo; acc[m][n][1] *= a_hi; acc[m][n][2] *= a_lo; acc[m][n][3] *= a_hi;
    }
  }
}
// the row's (or part's) statistics: linv[h] for the output, and with split > 1 each head's running
// max and sum after its part's D values in part
__device__ __forceinline__ void write_stats(int sh, int j8, int H, int split, float m_run, float l_run, float pscale,
                                            float* linv, float* part, int b, int s) {
  if (sh < H && j8 == 0) {
    if (split == 1) {
      linv[sh] = l_run > 0.0f ? 1.0f / (l_run * pscale) : 0.0f;
    } else {
      linv[sh] = 1.0f / pscale;
      float* ml = part + (((long long)b * split + s) * H + sh) * (D + 2);
      ml[D] = m_run;
      ml[D + 1] = l_run;
    }
  }
}
// one group of 32 output columns from d0: its even tile (rows g, g + 8 -> columns d0 + 2g, d0 + 16
// + 2g) and odd tile (the next column each), times linv, to out (bf16, split 1) or part (float32)
__device__ __forceinline__ void store_group(const float (&ev4)[NT][4], const float (&ov4)[NT][4], int d0, int g, int t,
                                            const float* linv, int H, int split, int b, int s, unsigned* out, float* part) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int h0 = n * 8 + 2 * t;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int h = h0 + hh;
      if (h >= H) continue;
      const float f = linv[h];
      const float* ev = ev4[n];
      const float* ov = ov4[n];
      if (split == 1) {
        unsigned* o = out + (((long long)b * H + h) * D) / 2;
        o[(d0 + 2 * g) / 2] = pack_bf16(ev[hh] * f, ov[hh] * f);
        o[(d0 + 16 + 2 * g) / 2] = pack_bf16(ev[2 + hh] * f, ov[2 + hh] * f);
      } else {
        float* o = part + (((long long)b * split + s) * H + h) * (D + 2);
        o[d0 + 2 * g] = ev[hh] * f;
        o[d0 + 2 * g + 1] = ov[hh] * f;
        o[d0 + 16 + 2 * g] = ev[2 + hh] * f;
        o[d0 + 17 + 2 * g] = ov[2 + hh] * f;
      }
    }
  }
}
"""

# the kernel on mma.sync (sm_89 and later)
_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256, 1)
absorbed_mma(const unsigned short* __restrict__ qa, const unsigned char* __restrict__ e8,
             const float* __restrict__ escale, unsigned* __restrict__ out, float* __restrict__ part,
             int H, int T, int split, int q_sb, int q_sh, double sm_log2) {
  extern __shared__ __align__(16) unsigned char smem[];
#ifdef BULK_COPY
  const unsigned mbar0 = smem_addr(smem);                    // two mbarriers, one a stage
  unsigned char* es_buf = smem + 16;                         // [2][BT][ROWB]
#else
  unsigned char* es_buf = smem;                              // [2][BT][ROWB]
#endif
  unsigned char* qs = es_buf + 2 * BT * ROWB;                // [HP][ROWB]
  float* red = (float*)(qs + HP * ROWB);                     // [2][HP][RS]
  unsigned char* p8 = (unsigned char*)(red + 2 * HP * RS);   // [HP][PS]
  float* alpha = (float*)(p8 + HP * PS);                     // [HP]
  float* esb = alpha + HP;                                   // [BT]
  float* linv = esb + BT;                                    // [HP]
  float* qsc_s = linv + HP;                                  // [HP]
  float* wred = qsc_s + HP;                                  // [8]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int b = blockIdx.x, s = blockIdx.y;
  const int nb = (T + BT - 1) / BT;
  const int j0 = s * nb / split, j1 = (s + 1) * nb / split;
  const unsigned char* e_row = e8 + (long long)b * T * D;
  const float* es_row = escale + (long long)b * T;
  row_scale_max(es_row, T, wred, tid, lane, warp);
  quantize_qa(qa + (long long)b * q_sb, q_sh, H, qs, qsc_s, (float)sm_log2, warp, lane,
              [](int h, int k) { return h * ROWB + k; });
  __syncthreads();
  float emax = wred[0];
#pragma unroll
  for (int w8 = 1; w8 < 8; ++w8) emax = fmaxf(emax, wred[w8]);
  const float pscale = E4M3_SCALE / fmaxf(emax, 1e-30f);
#ifdef BULK_COPY
  if (tid == 0) {
    mbar_init(mbar0);
    mbar_init(mbar0 + 8);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // warp 0 copies a block's rows (one bulk copy a row: shared rows are ROWB apart); the rows past
  // T are zeroed by every thread (E4M3's NaN bytes must not meet P's zeros)
  auto load_block = [&](int j, int stage) {
    unsigned char* buf = es_buf + stage * BT * ROWB;
    const int rows = min(BT, T - j * BT);
    for (int c = tid; c < (BT - rows) * (D / 16); c += 256)
      *(uint4*)(buf + (rows + c / (D / 16)) * ROWB + (c % (D / 16)) * 16) = make_uint4(0u, 0u, 0u, 0u);
    if (warp == 0) {
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      if (lane == 0) mbar_expect(mbar0 + 8 * stage, (unsigned)(rows * D));
      __syncwarp();
      for (int r = lane; r < rows; r += 32)
        bulk_copy(smem_addr(buf + r * ROWB), e_row + (long long)(j * BT + r) * D, D, mbar0 + 8 * stage);
    }
  };
  if (j0 < j1) load_block(j0, 0);
#else
  auto load_block = [&](int j, int stage) {
    unsigned char* buf = es_buf + stage * BT * ROWB;
    for (int c = tid; c < BT * (D / 16); c += 256) {
      int r = c / (D / 16), col = (c % (D / 16)) * 16;
      int pos = j * BT + r;
      bool ok = pos < T;
      cp_async16(smem_addr(buf + r * ROWB + col), e_row + (long long)(ok ? pos : 0) * D + col, ok ? 16 : 0);
    }
  };
  if (j0 < j1) load_block(j0, 0);
  cp_commit();
#endif

  float acc[2 * GPW][NT][4];
#pragma unroll
  for (int m = 0; m < 2 * GPW; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.0f;
  // softmax threads: head sh = tid >> 3, 8 threads a head, positions j8 + 8 i
  const int sh = tid >> 3, j8 = tid & 7;
  float m_run = NEG_INF, l_run = 0.0f;
  const float qsc = (sh < H) ? qsc_s[sh] : 0.0f;

  for (int j = j0; j < j1; ++j) {
    const int stage = (j - j0) & 1;
    if (j + 1 < j1) load_block(j + 1, stage ^ 1);
    if (tid < BT) esb[tid] = (j * BT + tid < T) ? es_row[j * BT + tid] : 0.0f;
#ifdef BULK_COPY
    mbar_wait(mbar0 + 8 * stage, ((j - j0) >> 1) & 1);  // each stage's barrier completes once a use
#else
    cp_commit();
    cp_wait1();
#endif
    __syncthreads();
    const unsigned char* buf = es_buf + stage * BT * ROWB;

    // 1. scores: warp -> 16 positions (mt) x half the width (kh)
    {
      const int mt = warp & 3, kh = warp >> 2;
      float c[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) c[n][i] = 0.0f;
      const int q = lane >> 3;
      const unsigned a_base = smem_addr(buf + (mt * 16 + (lane & 7) + 8 * (q & 1)) * ROWB + 16 * (q >> 1));
#ifdef FRAGMENTS_AHEAD  // a candidate build: step ks + 1's fragments loaded before step ks's
                        // products (the asm statements keep their order), so latencies overlap
      const unsigned char* q_base = qs + g * ROWB + kh * (D / 2) + 4 * t;
      unsigned a[2][4], bq[2][NT][2];
      ldsm4(a_base + kh * (D / 2), a[0][0], a[0][1], a[0][2], a[0][3]);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        bq[0][n][0] = *(const unsigned*)(q_base + n * 8 * ROWB);
        bq[0][n][1] = *(const unsigned*)(q_base + n * 8 * ROWB + 16);
      }
#pragma unroll
      for (int ks = 0; ks < KS1; ++ks) {
        const int cur = ks & 1, nxt = cur ^ 1;
        if (ks + 1 < KS1) {
          const int kb = kh * (D / 2) + (ks + 1) * 32;
          ldsm4(a_base + kb, a[nxt][0], a[nxt][1], a[nxt][2], a[nxt][3]);
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            bq[nxt][n][0] = *(const unsigned*)(q_base + n * 8 * ROWB + (ks + 1) * 32);
            bq[nxt][n][1] = *(const unsigned*)(q_base + n * 8 * ROWB + (ks + 1) * 32 + 16);
          }
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#ifndef SKIP_SCORES  // a diagnostic build (bench/gpu_absorbed_attend.py): the products left out
          mma8(c[n], a[cur][0], a[cur][1], a[cur][2], a[cur][3], bq[cur][n][0], bq[cur][n][1]);
#else
          c[n][0] += __uint_as_float(a[cur][0] ^ bq[cur][n][0]); c[n][1] += __uint_as_float(a[cur][1] ^ bq[cur][n][1]);
          c[n][2] += __uint_as_float(a[cur][2]); c[n][3] += __uint_as_float(a[cur][3]);
#endif
        }
      }
#else
#pragma unroll 4
      for (int ks = 0; ks < KS1; ++ks) {
        const int kb = kh * (D / 2) + ks * 32;
        unsigned a0, a1, a2, a3;
        ldsm4(a_base + kb, a0, a1, a2, a3);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const unsigned char* qrow = qs + (n * 8 + g) * ROWB + kb + 4 * t;
          unsigned b0 = *(const unsigned*)qrow, b1 = *(const unsigned*)(qrow + 16);
#ifndef SKIP_SCORES  // a diagnostic build (bench/gpu_absorbed_attend.py): the products left out
          mma8(c[n], a0, a1, a2, a3, b0, b1);
#else
          c[n][0] += __uint_as_float(a0 ^ b0); c[n][1] += __uint_as_float(a1 ^ b1);
          c[n][2] += __uint_as_float(a2); c[n][3] += __uint_as_float(a3);
#endif
        }
      }
#endif
      store_scores(c, red + kh * HP * RS, mt, g, t);
    }
    __syncthreads();

    // 2. online softmax per head (scores in log2 units: qscale carries log2(e) / sqrt(head_dim))
    if (sh < HP) {
      if (sh < H) {
        const unsigned grp8 = 0xffu << (lane & 24);  // the 8 lanes of this head, all in this branch
        float sv[8];
        float bmax = NEG_INF;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int p = j8 + 8 * i;
          float v = (red[sh * RS + p] + red[(HP + sh) * RS + p]) * qsc * esb[p];
          v = (j * BT + p < T) ? v : NEG_INF;
          sv[i] = v;
          bmax = fmaxf(bmax, v);
        }
        bmax = fmaxf(bmax, __shfl_xor_sync(grp8, bmax, 1));
        bmax = fmaxf(bmax, __shfl_xor_sync(grp8, bmax, 2));
        bmax = fmaxf(bmax, __shfl_xor_sync(grp8, bmax, 4));
        const float m_new = fmaxf(m_run, bmax);
        const float al = exp2f(m_run - m_new);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int p = j8 + 8 * i;
          const float pr = exp2f(sv[i] - m_new);
          sum += pr;
          p8[sh * PS + (p >> 5) * 32 + k_of(p & 31)] = to_e4m3(pr * esb[p] * pscale);
        }
        sum += __shfl_xor_sync(grp8, sum, 1);
        sum += __shfl_xor_sync(grp8, sum, 2);
        sum += __shfl_xor_sync(grp8, sum, 4);
        l_run = l_run * al + sum;
        m_run = m_new;
        if (j8 == 0) alpha[sh] = al;
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) p8[sh * PS + j8 + 8 * i] = 0;
        if (j8 == 0) alpha[sh] = 1.0f;
      }
    } else {
      // threads of heads 24..31 have no head; their shuffles above are in other warps
    }
    __syncthreads();

    // 3. output: warp w -> the width's groups of 32 columns w, w + 8, ..., 2 k-steps of 32 positions
    {
      rescale(acc, alpha, t);
      const int q = lane >> 3;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        unsigned bf[NT][2];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const unsigned char* prow = p8 + (n * 8 + g) * PS + ks * 32 + 4 * t;
          bf[n][0] = *(const unsigned*)prow;
          bf[n][1] = *(const unsigned*)(prow + 16);
        }
        const unsigned char* rows = buf + (ks * 32 + (lane & 7) + 8 * (q & 1)) * ROWB + 16 * (q >> 1);
#ifdef FRAGMENTS_AHEAD  // E's transposed fragments double-buffered across the column groups
        unsigned r[2][8];
        if (warp < NG) {
          ldsm4t(smem_addr(rows + warp * 32), r[0][0], r[0][1], r[0][2], r[0][3]);
          ldsm4t(smem_addr(rows + 16 * ROWB + warp * 32), r[0][4], r[0][5], r[0][6], r[0][7]);
        }
#pragma unroll
        for (int grp = 0; grp < GPW; ++grp) {
          if (warp + 8 * grp >= NG) break;
          const int cur = grp & 1, nxt = cur ^ 1;
          if (grp + 1 < GPW && warp + 8 * (grp + 1) < NG) {
            const int d1 = (warp + 8 * (grp + 1)) * 32;
            ldsm4t(smem_addr(rows + d1), r[nxt][0], r[nxt][1], r[nxt][2], r[nxt][3]);
            ldsm4t(smem_addr(rows + 16 * ROWB + d1), r[nxt][4], r[nxt][5], r[nxt][6], r[nxt][7]);
          }
          const unsigned* rc = r[cur];
          const unsigned e0 = __byte_perm(rc[0], rc[1], 0x6420), e1 = __byte_perm(rc[2], rc[3], 0x6420);
          const unsigned e2 = __byte_perm(rc[4], rc[5], 0x6420), e3 = __byte_perm(rc[6], rc[7], 0x6420);
          const unsigned o0 = __byte_perm(rc[0], rc[1], 0x7531), o1 = __byte_perm(rc[2], rc[3], 0x7531);
          const unsigned o2 = __byte_perm(rc[4], rc[5], 0x7531), o3 = __byte_perm(rc[6], rc[7], 0x7531);
#pragma unroll
          for (int n = 0; n < NT; ++n) {
#ifndef SKIP_OUTPUT  // a diagnostic build: the products left out
            mma8(acc[2 * grp][n], e0, e1, e2, e3, bf[n][0], bf[n][1]);
            mma8(acc[2 * grp + 1][n], o0, o1, o2, o3, bf[n][0], bf[n][1]);
#else
            acc[2 * grp][n][0] += __uint_as_float(e0 ^ e1 ^ bf[n][0]); acc[2 * grp][n][1] += __uint_as_float(e2 ^ e3);
            acc[2 * grp + 1][n][0] += __uint_as_float(o0 ^ o1 ^ bf[n][1]); acc[2 * grp + 1][n][1] += __uint_as_float(o2 ^ o3);
#endif
          }
        }
#else
#pragma unroll
        for (int grp = 0; grp < GPW; ++grp) {
          if (warp + 8 * grp >= NG) break;
          const int d0 = (warp + 8 * grp) * 32;
          unsigned r0, r1, r2, r3, r4, r5, r6, r7;
          ldsm4t(smem_addr(rows + d0), r0, r1, r2, r3);
          ldsm4t(smem_addr(rows + 16 * ROWB + d0), r4, r5, r6, r7);
          const unsigned e0 = __byte_perm(r0, r1, 0x6420), e1 = __byte_perm(r2, r3, 0x6420);
          const unsigned e2 = __byte_perm(r4, r5, 0x6420), e3 = __byte_perm(r6, r7, 0x6420);
          const unsigned o0 = __byte_perm(r0, r1, 0x7531), o1 = __byte_perm(r2, r3, 0x7531);
          const unsigned o2 = __byte_perm(r4, r5, 0x7531), o3 = __byte_perm(r6, r7, 0x7531);
#pragma unroll
          for (int n = 0; n < NT; ++n) {
#ifndef SKIP_OUTPUT  // a diagnostic build: the products left out
            mma8(acc[2 * grp][n], e0, e1, e2, e3, bf[n][0], bf[n][1]);
            mma8(acc[2 * grp + 1][n], o0, o1, o2, o3, bf[n][0], bf[n][1]);
#else
            acc[2 * grp][n][0] += __uint_as_float(e0 ^ e1 ^ bf[n][0]); acc[2 * grp][n][1] += __uint_as_float(e2 ^ e3);
            acc[2 * grp + 1][n][0] += __uint_as_float(o0 ^ o1 ^ bf[n][1]); acc[2 * grp + 1][n][1] += __uint_as_float(o2 ^ o3);
#endif
          }
        }
#endif
      }
    }
    __syncthreads();
  }
#ifndef BULK_COPY
  cp_wait0();
#endif

  write_stats(sh, j8, H, split, m_run, l_run, pscale, linv, part, b, s);
  __syncthreads();
#pragma unroll
  for (int grp = 0; grp < GPW; ++grp) {
    if (warp + 8 * grp >= NG) break;
    store_group(acc[2 * grp], acc[2 * grp + 1], (warp + 8 * grp) * 32, g, t, linv, H, split, b, s, out, part);
  }
}
""".replace("E4M3_SCALE", "448.0f")

# the kernel on Hopper's warp-group products (sm_90a): the products on FP8 tensor cores natively
# (mma.sync's e4m3 shape runs on sm_90 as conversions to f16 and two f16 products, ncu's SASS of
# the kernel above: F2FP.F16.E4M3.UNPACK_B and HMMA.16816, a quarter of its instructions each)
_WG_SOURCE = r"""
#define NC (D / 16)                     // 16-byte chunks a row
#ifdef WG_SW128
#define NA ((D + 127) / 128)            // 128-byte columns ("atoms") of E's swizzled block
#define EST (NA * BT * 128)             // bytes of one stage of E
#else
#define EST (BT * D)
#endif
#define GWG (NG / 2)                    // groups of 32 columns a warp group
#define PAIRS ((GWG + 3) / 4)           // pairs of m64 tiles a warp group, one group a warp each
// shared-memory layout of an FP8 operand [rows][D] for wgmma without swizzle: 8 rows x 16 bytes
// ("core matrices") contiguous, K-direction neighbours 128 bytes apart (LBO), the next 8 rows
// NC x 128 apart (SBO)
__device__ __forceinline__ int blk(int r, int c) { return (((r >> 3) * NC + (c >> 4)) << 7) + ((r & 7) << 4) + (c & 15); }
// E's block [BT][D] in shared memory: as blk (no swizzle), or (WG_SW128) in 128-byte columns of BT
// rows of 128 bytes, each column BT x 128 bytes, the 16-byte chunk c of row r at chunk c ^ (r % 8)
// (the 128-byte swizzle of the wgmma descriptors and of TMA's CU_TENSOR_MAP_SWIZZLE_128B; a stage
// 1024-byte aligned)
__device__ __forceinline__ int eoff(int r, int c) {
#ifdef WG_SW128
  return ((c >> 7) * BT << 7) + (r << 7) + ((((c >> 4) & 7) ^ (r & 7)) << 4) + (c & 15);
#else
  return blk(r, c);
#endif
}
#ifdef WG_TMA
// the driver's CUtensorMap of E (128 bytes, 64-byte aligned), passed by value as a __grid_constant__ parameter
struct __align__(64) TensorMap { unsigned long long v[16]; };
__device__ __forceinline__ void tma_load3(unsigned dst, const TensorMap* map, int c0, int c1, int c2, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
               :: "r"(dst), "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
#endif
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
#ifdef WG_SWAP  // a diagnostic build: the two offsets the other way round
  const unsigned t_ = lbo; lbo = sbo; sbo = t_;
#endif
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16)
       | ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32);
}
// the scores' A operand (E's block, 64 positions x 32 bytes of width from byte kb) as a descriptor
__device__ __forceinline__ unsigned long long e_desc(unsigned buf_a, int kb) {
#ifdef WG_SW128  // 128-byte swizzle (mode 1, bits 62-63): rows 8 apart 1024 bytes (SBO), LBO unused
  const unsigned a = buf_a + (kb >> 7) * (BT * 128) + (kb & 127);
  return (unsigned long long)((a & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
#else
  return wg_desc(buf_a + (kb >> 4) * 128, 128, NC * 128);
#endif
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// d [HP / 2] += A [64 x 32] B [32 x HP]: A and B from shared memory (SS) or A from registers (RS)
__device__ __forceinline__ void wg_ss(float* d, unsigned long long da, unsigned long long db, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" WG_NA ", 0;\n"
               "wgmma.mma_async.sync.aligned.m64n" WG_N "k32.f32.e4m3.e4m3 {" WG_DREGS "}, %" WG_DA ", %" WG_DB ", p, 1, 1;\n}\n"
               : WG_DOUT : "l"(da), "l"(db), "r"(accumulate) : "memory");
}
__device__ __forceinline__ void wg_rs_d(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned long long db,
                                        int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" WG_RNA ", 0;\n"
               "wgmma.mma_async.sync.aligned.m64n" WG_N "k32.f32.e4m3.e4m3 {" WG_DREGS "}, "
               "{%" WG_R0 ", %" WG_R1 ", %" WG_R2 ", %" WG_R3 "}, %" WG_RB ", p, 1, 1;\n}\n"
               : WG_DOUT : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(accumulate) : "memory");
}
__device__ __forceinline__ void wg_rs(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned long long db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n" WG_N "k32.f32.e4m3.e4m3 {" WG_DREGS "}, "
               "{%" WG_R0 ", %" WG_R1 ", %" WG_R2 ", %" WG_R3 "}, %" WG_RB ", 1, 1, 1;\n"
               : WG_DOUT : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db) : "memory");
}

extern "C" __global__ void __launch_bounds__(256, 1)
absorbed_wgmma(const unsigned short* __restrict__ qa, const unsigned char* __restrict__ e8,
               const float* __restrict__ escale, unsigned* __restrict__ out, float* __restrict__ part,
               int H, int T, int split, int q_sb, int q_sh, double sm_log2
#ifdef WG_TMA
               , const __grid_constant__ TensorMap e_map
#endif
               ) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
#ifdef WG_SW128  // the swizzle repeats every 1024 bytes: E's stages start on such a boundary (with
                 // __align__(1024) the pad folds to 0; it stays, with its 1 KB, should an alignment be dropped)
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
#else
  unsigned char* smem = smem_raw;
#endif
  unsigned char* es_buf = smem;                              // [2][EST], E's blocks (eoff)
#ifdef WG_TMA
  const unsigned mbar0 = smem_addr(es_buf + 2 * EST);        // two mbarriers, one a stage
  unsigned char* qs = es_buf + 2 * EST + 16;                 // [HP x D], blocked
#else
  unsigned char* qs = es_buf + 2 * EST;                      // [HP x D], blocked
#endif
  float* red = (float*)(qs + HP * D);                        // [2][HP][RS]
  unsigned char* p8 = (unsigned char*)(red + 2 * HP * RS);   // [HP x 64], blocked as [HP][64] with NC = 4
  float* alpha = (float*)(p8 + HP * 64);                     // [HP]
  float* esb = alpha + HP;                                   // [2][BT]: e_scale of each stage's positions
  float* linv = esb + 2 * BT;                                // [HP]
  float* qsc_s = linv + HP;                                  // [HP]
  float* wred = qsc_s + HP;                                  // [8]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, w4 = warp & 3;
  const int g = lane >> 2, t = lane & 3;
  const int b = blockIdx.x, s = blockIdx.y;
  const int nb = (T + BT - 1) / BT;
  const int j0 = s * nb / split, j1 = (s + 1) * nb / split;
  const unsigned char* e_row = e8 + (long long)b * T * D;
  const float* es_row = escale + (long long)b * T;
  // E's block j and its positions' scales into stage: warp-tile i (8 rows x 4 chunks) = rows
  // 8 (i % 8) + lane % 8, chunks 4 (i / 8) + lane / 8: 64 bytes a row from global, four whole core
  // matrices in shared memory; positions past T zero
  // (WG_SW128: chunk L of the block's BT x NC, L = 32 (warp + 8 m) + lane, 512 contiguous bytes a
  // warp from global, a whole swizzled 128-byte row of shared memory each 8 lanes; WG_TMA: NA tensor
  // copies of 64 positions x 128 bytes issued by thread 0, positions past T zero-filled by the copy)
  auto load_block = [&](int j, int stage) {
    unsigned char* buf = es_buf + stage * EST;
#if defined(WG_TMA)
    (void)e_row;
    if (tid == 0) {
      const unsigned bar = mbar0 + 8 * stage;
      mbar_expect(bar, EST);
#pragma unroll 1
      for (int a = 0; a < NA; ++a) tma_load3(smem_addr(buf + a * BT * 128), &e_map, 128 * a, j * BT, b, bar);
    }
#elif defined(WG_SW128)
#pragma unroll 4
    for (int m = 0; m < NC / 4; ++m) {
      const int L = tid + 256 * m, r = L / NC, c = 16 * (L - r * NC);
      const int pos = j * BT + r;
      const bool ok = pos < T;
      cp_async16(smem_addr(buf + eoff(r, c)), e_row + (long long)(ok ? pos : 0) * D + c, ok ? 16 : 0);
    }
#else
    for (int i = warp; i < 2 * NC; i += 8) {
      const int r = 8 * (i & 7) + (lane & 7), c = 16 * (4 * (i >> 3) + (lane >> 3));
      const int pos = j * BT + r;
      const bool ok = pos < T;
      cp_async16(smem_addr(buf + blk(r, c)), e_row + (long long)(ok ? pos : 0) * D + c, ok ? 16 : 0);
    }
#endif
    if (tid < BT) {
      const int pos = j * BT + tid;
      cp_async4(smem_addr(esb + stage * BT + tid), es_row + (pos < T ? pos : 0), pos < T ? 4 : 0);
    }
  };
#ifdef WG_TMA
  if (tid == 0) {
    mbar_init(mbar0);
    mbar_init(mbar0 + 8);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
#endif
  // the first block is on its way while qa is quantized
  if (j0 < j1) load_block(j0, 0);
  cp_commit();
  row_scale_max(es_row, T, wred, tid, lane, warp);
  // qa's FP8 copy, blocked
  quantize_qa(qa + (long long)b * q_sb, q_sh, H, qs, qsc_s, (float)sm_log2, warp, lane, [](int h, int k) { return blk(h, k); });
  proxy_fence();
  __syncthreads();
  float emax = wred[0];
#pragma unroll
  for (int w8 = 1; w8 < 8; ++w8) emax = fmaxf(emax, wred[w8]);
  const float pscale = 448.0f / fmaxf(emax, 1e-30f);
  float acc[2 * PAIRS][NT][4];
#pragma unroll
  for (int m = 0; m < 2 * PAIRS; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.0f;
  const int sh = tid >> 3, j8 = tid & 7;
  float m_run = NEG_INF, l_run = 0.0f;
  const float qsc = (sh < H) ? qsc_s[sh] : 0.0f;
  const unsigned qs_a = smem_addr(qs), p8_a = smem_addr(p8);

  for (int j = j0; j < j1; ++j) {
    const int stage = (j - j0) & 1;
    if (j + 1 < j1) load_block(j + 1, stage ^ 1);
    cp_commit();
    cp_wait1();
#ifdef WG_TMA  // the n-th use of a stage completes its mbarrier's phase n
    mbar_wait(mbar0 + 8 * stage, ((j - j0) >> 1) & 1);
#endif
    proxy_fence();
    __syncthreads();
    const unsigned char* buf = es_buf + stage * EST;
    const unsigned buf_a = smem_addr(buf);
    const float* esv = esb + stage * BT;
#ifndef WG_LOADS_ONLY  // a diagnostic build: E's blocks brought in, nothing computed (its output zeros)

    // 1. scores [64 positions, HP] over warp group wg's half of the width, KS1 products of k32
    {
      float c[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) c[n][i] = 0.0f;
      wg_fence();
#pragma unroll
      for (int ks = 0; ks < KS1; ++ks) {
        const int kb = wg * (D / 2) + ks * 32;
#ifndef WG_SKIP_SCORES  // a diagnostic build: the products left out
        wg_ss(&c[0][0], e_desc(buf_a, kb), wg_desc(qs_a + (kb >> 4) * 128, 128, NC * 128), ks > 0);
#else
        c[0][0] += (float)kb;
#endif
      }
      wg_commit();
      wg_wait0();
      store_scores(c, red + wg * HP * RS, w4, g, t);
    }
    __syncthreads();

    // 2. online softmax per head, P blocked as [HP][64] in the output product's K order. Every
    // thread runs the same instructions (heads past H, and threads past HP, by selects and
    // predicated stores): a branch that differs between the warps of a warp group here made ptxas
    // serialize the warp-group products (its warning C7520)
    {
      const bool live = sh < H, padded = sh < HP;
      const int shc = min(sh, HP - 1);
      float sv[8];
      float bmax = NEG_INF;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int p = j8 + 8 * i;
        float v = (red[shc * RS + p] + red[(HP + shc) * RS + p]) * qsc * esv[p];
        v = (live && j * BT + p < T) ? v : NEG_INF;
        sv[i] = v;
        bmax = fmaxf(bmax, v);
      }
      bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffff, bmax, 1));
      bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffff, bmax, 2));
      bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffff, bmax, 4));
      const float m_new = fmaxf(m_run, bmax);
      const float al = live ? exp2f(m_run - m_new) : 1.0f;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int p = j8 + 8 * i;
        const float pr = live ? exp2f(sv[i] - m_new) : 0.0f;
        sum += pr;
        const int kk = (p >> 5) * 32 + k_of(p & 31);
        const unsigned char v8 = to_e4m3(pr * esv[p] * pscale);
        if (padded) p8[(((shc >> 3) * 4 + (kk >> 4)) << 7) + ((shc & 7) << 4) + (kk & 15)] = v8;
      }
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      sum += __shfl_xor_sync(0xffffffff, sum, 4);
      l_run = l_run * al + sum;
      m_run = m_new;
      if (padded && j8 == 0) alpha[shc] = al;
    }
    proxy_fence();
    __syncthreads();

    // 3. output: warp group wg, pair i: m64 tiles 2i (even columns) and 2i + 1 (odd) of its
    // groups; warp w4 gives the 16 rows of group wg * GWG + 4 i + w4 (zeros past the width)
    {
      rescale(acc, alpha, t);
      const int q = lane >> 3;
      // pair i's fragments at k-step ks: even tile e, odd tile o (A operands of m64nHPk32). A warp
      // past the width's groups reads group 0 and gives zeros (a select, not a branch: the
      // products want the warp group's warps together)
      auto fragments = [&](int ks, int i, unsigned (&e)[4], unsigned (&o)[4]) {
        const int r0 = ks * 32 + (lane & 7) + 8 * (q & 1);
        const bool has = GWG % 4 == 0 || 4 * i + w4 < GWG;
        const int c0 = (has ? (wg * GWG + 4 * i + w4) * 32 : 0) + 16 * (q >> 1);
        unsigned r[8];
        ldsm4t(smem_addr(buf + eoff(r0, c0)), r[0], r[1], r[2], r[3]);
        ldsm4t(smem_addr(buf + eoff(r0 + 16, c0)), r[4], r[5], r[6], r[7]);
#pragma unroll
        for (int k = 0; k < 8; ++k) r[k] = has ? r[k] : 0u;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          e[k] = __byte_perm(r[2 * k], r[2 * k + 1], 0x6420);
          o[k] = __byte_perm(r[2 * k], r[2 * k + 1], 0x7531);
        }
      };
#if defined(WG_SKIP_OUTPUT)  // a diagnostic build: the products left out
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int i = 0; i < PAIRS; ++i) {
          unsigned e[4], o[4];
          fragments(ks, i, e, o);
          acc[2 * i][0][0] += __uint_as_float(e[0] ^ e[1] ^ e[2] ^ e[3]);
          acc[2 * i + 1][0][0] += __uint_as_float(o[0] ^ o[1] ^ o[2] ^ o[3]);
        }
#elif defined(WG_PROMOTE)  // a candidate build: each block's products into a temporary, added in
                           // float32 (Hopper's FP8 products accumulate with about 14 bits)
#pragma unroll
      for (int i = 0; i < PAIRS; ++i) {
        float te[NT][4], to[NT][4];
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          unsigned e[4], o[4];
          fragments(ks, i, e, o);
          const unsigned long long dp = wg_desc(p8_a + ks * 2 * 128, 128, 4 * 128);
          wg_fence();
          wg_rs_d(&te[0][0], e[0], e[1], e[2], e[3], dp, ks);
          wg_rs_d(&to[0][0], o[0], o[1], o[2], o[3], dp, ks);
        }
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            acc[2 * i][n][k] += te[n][k];
            acc[2 * i + 1][n][k] += to[n][k];
          }
      }
#else
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const unsigned long long dp = wg_desc(p8_a + ks * 2 * 128, 128, 4 * 128);
#pragma unroll
        for (int i = 0; i < PAIRS; ++i) {
          unsigned e[4], o[4];
          fragments(ks, i, e, o);
          // the fence between this thread's last writes of the registers a product reads (the
          // accumulators, rescaled above, and this pair's fragments) and the product (PTX ISA,
          // wgmma.fence); without it ptxas inserted one itself (its note C7519)
          wg_fence();
          wg_rs(&acc[2 * i][0][0], e[0], e[1], e[2], e[3], dp);
          wg_rs(&acc[2 * i + 1][0][0], o[0], o[1], o[2], o[3], dp);
        }
      }
      wg_commit();
      wg_wait0();
#endif
    }
#endif  // WG_LOADS_ONLY
    __syncthreads();
  }
  cp_wait0();

  write_stats(sh, j8, H, split, m_run, l_run, pscale, linv, part, b, s);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < PAIRS; ++i) {
    if (4 * i + w4 >= GWG) continue;
    store_group(acc[2 * i], acc[2 * i + 1], (wg * GWG + 4 * i + w4) * 32, g, t, linv, H, split, b, s, out, part);
  }
}
"""


def _wg_asm_defines(hp: int) -> str:
    """The macros that spell the wgmma statements' operands for ``hp`` heads (``hp / 2``
    accumulator registers a thread)."""
    nd = hp // 2
    regs = ",".join(f"%{i}" for i in range(nd))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nd))
    return (f'#define WG_N "{hp}"\n#define WG_DREGS "{regs}"\n#define WG_DOUT {outs}\n'
            f'#define WG_DA "{nd}"\n#define WG_DB "{nd + 1}"\n#define WG_NA "{nd + 2}"\n'
            f'#define WG_R0 "{nd}"\n#define WG_R1 "{nd + 1}"\n#define WG_R2 "{nd + 2}"\n#define WG_R3 "{nd + 3}"\n'
            f'#define WG_RB "{nd + 4}"\n#define WG_RNA "{nd + 5}"\n')


def smem_bytes_wg(d: int, hp: int, defines: str = "") -> int:
    """Shared memory of one program of the sm_90a kernel: E's two blocks, qa, the score halves, P,
    and the per-head and per-position scalars (at large-v3's width and 24 padded heads about 205
    KB); with ``WG_SW128`` E's blocks in whole 128-byte columns and 1 KB to align them, with
    ``WG_TMA`` two mbarriers."""
    macros = _macros(defines)
    stage = BLOCK_T * d
    extra = 0
    if "WG_SW128" in macros:
        stage, extra = BLOCK_T * 128 * -(-d // 128), 1024
    if "WG_TMA" in macros:
        extra += 16
    return 2 * stage + extra + hp * d + 2 * hp * 68 * 4 + hp * 64 + (3 * hp + 2 * BLOCK_T + 8) * 4


def smem_bytes(d: int, hp: int) -> int:
    """Shared memory of one program at width ``d`` and ``hp`` padded heads: two mbarriers (the
    ``BULK_COPY`` build's), E's two blocks, qa's FP8 copy, the score halves, P, and the per-head
    and per-position scalars."""
    return 16 + 2 * BLOCK_T * (d + 16) + hp * (d + 16) + 2 * hp * 68 * 4 + hp * 80 + (4 * hp + BLOCK_T + 8) * 4


_kernels: dict[tuple[int, int, int, str], tuple[Any, int]] = {}


def _is_wg(defines: str) -> bool:
    """Whether a build is the warp-group kernel's (``WGMMA`` among its macros)."""
    return "WGMMA" in defines.split(",")


def _macros(defines: str) -> list[str]:
    """A build's macros (``defines``, comma-separated), with ``WG_SW128`` added where ``WG_TMA``
    asks for it (the tensor copies write E's blocks in that layout)."""
    macros = [m for m in defines.split(",") if m]
    if "WG_TMA" in macros and "WG_SW128" not in macros:
        macros.append("WG_SW128")
    return macros


def kernel_source(d: int, hp: int, defines: str = "") -> tuple[str, str, str | None]:
    """A build's CUDA C source for width ``d`` and ``hp`` padded heads, its kernel's name, and the
    architecture NVRTC must compile it for (``"90a"`` for the warp-group kernel, whose products
    exist only there; None: the GPU at hand). ``defines``: ``_compiled``'s."""
    src = "".join(f"#define {m}\n" for m in _macros(defines)) + f"#define D {d}\n#define HP {hp}\n#define NT {hp // 8}\n"
    if _is_wg(defines):
        return src + _wg_asm_defines(hp) + _HELPERS + _WG_SOURCE, "absorbed_wgmma", "90a"
    return src + _HELPERS + _SOURCE, "absorbed_mma", None


def _compiled(d: int, hp: int, defines: str = "") -> Any:
    """The kernel for width ``d`` and ``hp`` padded heads and its shared memory in bytes
    (``defines``: comma-separated macros of a diagnostic build, ``SKIP_SCORES`` or
    ``SKIP_OUTPUT``, or of a candidate, ``FRAGMENTS_AHEAD`` or ``BULK_COPY`` (sm_90); ``WGMMA``:
    the sm_90a kernel, ``absorbed_wgmma``, with its candidates ``WG_PROMOTE`` (each block's output
    products added in float32), ``WG_SW128`` and ``WG_TMA`` (E's loads, module doc) and its
    diagnostic builds ``WG_SKIP_SCORES``, ``WG_SKIP_OUTPUT``, ``WG_LOADS_ONLY`` and ``WG_SWAP``),
    compiled once per GPU by NVRTC through PyTorch (``torch.cuda._compile_kernel``, a private API
    of PyTorch 2.8 and later: no other package needed). RuntimeError on a GPU older than sm_89
    (other than sm_90 for ``WGMMA``),
    one whose blocks cannot have the shared memory this width needs (``smem_bytes``: 112 KB and
    more from width 768, over the 99 KB of sm_89 and sm_120 GPUs; H100 and H200 have 227 KB), or
    a PyTorch without it."""
    dev = torch.cuda.current_device()
    if (dev, d, hp, defines) not in _kernels:
        wg = _is_wg(defines)
        major, minor = torch.cuda.get_device_capability(dev)
        if (major, minor) < (8, 9) or (wg and (major, minor) != (9, 0)):
            raise RuntimeError(f"the absorbed cross-attention kernel needs FP8 tensor cores (sm_89 or later; its "
                               f"WGMMA build sm_90); this GPU is sm_{major}{minor}")
        need = smem_bytes_wg(d, hp, defines) if wg else smem_bytes(d, hp)
        limit = getattr(torch.cuda.get_device_properties(dev), "shared_memory_per_block_optin", 0)
        if need > limit:
            raise RuntimeError(f"the absorbed cross-attention kernel needs {need} bytes of shared memory "
                               f"a block at width {d}; this GPU (sm_{major}{minor}) gives {limit}: set model.cross_attention: kv")
        compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
        if compile_kernel is None:
            raise RuntimeError(f"the absorbed cross-attention kernel needs PyTorch 2.8 or later (torch.cuda._compile_kernel); "
                               f"this is {torch.__version__}")
        src, name, arch = kernel_source(d, hp, defines)
        k = compile_kernel(src, name, compute_capability=arch, nvcc_options=["--std=c++17"])
        if hasattr(k, "set_shared_memory_config"):
            k.set_shared_memory_config(need)
        else:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
            from torch.cuda._utils import _get_gpu_runtime_library
            _get_gpu_runtime_library().cuFuncSetAttribute(k.func, 8, need)
        _kernels[dev, d, hp, defines] = (k, need)
    return _kernels[dev, d, hp, defines]


# CUDA driver enums (cuda.h): CU_TENSOR_MAP_DATA_TYPE_UINT8, CU_TENSOR_MAP_SWIZZLE_128B,
# CU_TENSOR_MAP_L2_PROMOTION_L2_256B
_MAP_UINT8, _MAP_SWIZZLE_128B, _MAP_L2_256B = 0, 3, 3
_maps: dict[tuple[int, ...], tuple[Any, int]] = {}


def tensor_map(e8: torch.Tensor) -> int:
    """The host address of a CUtensorMap (128 bytes, 64-byte aligned) of ``e8 [N, T, D]`` (uint8
    view, contiguous) for the ``WG_TMA`` build's tensor copies: boxes of 128 bytes x ``BLOCK_T``
    positions x 1 row, written in the 128-byte swizzle, positions past T zero-filled. Encoded once
    per tensor address and shape by the driver's ``cuTensorMapEncodeTiled`` (CUDA 12 and later)
    and kept (at most 64). RuntimeError with the driver's message if it refuses (e.g. a width
    that is not a multiple of 16)."""
    n, t, d = e8.shape
    key = (e8.device.index or 0, e8.data_ptr(), n, t, d)
    entry = _maps.get(key)
    if entry is None:
        import ctypes

        from torch.cuda._utils import _check_cuda, _get_gpu_runtime_library
        if len(_maps) >= 64:
            _maps.clear()
        buf = (ctypes.c_uint8 * 192)()
        addr = (ctypes.addressof(buf) + 63) // 64 * 64
        u64, u32 = ctypes.c_uint64, ctypes.c_uint32
        _check_cuda(_get_gpu_runtime_library().cuTensorMapEncodeTiled(
            ctypes.c_void_p(addr), _MAP_UINT8, 3, ctypes.c_void_p(e8.data_ptr()), (u64 * 3)(d, t, n), (u64 * 2)(d, t * d),
            (u32 * 3)(128, BLOCK_T, 1), (u32 * 3)(1, 1, 1), 0, _MAP_SWIZZLE_128B, _MAP_L2_256B, 0))
        entry = _maps[key] = (buf, addr)
    return entry[1]


def _launch(d: int, hp: int, grid: tuple[int, int], args: list, defines: str = "") -> None:
    """One launch on PyTorch's current device and stream; ``args`` tensors (as pointers), ints (as
    C int) and floats (as C double); the ``WG_TMA`` build also gets ``tensor_map(args[1])`` (E)
    as its last parameter, by value, through the driver's ``cuLaunchKernel``."""
    k, need = _compiled(d, hp, defines)
    if "WG_TMA" not in _macros(defines):
        k(grid=(grid[0], grid[1], 1), block=(256, 1, 1), args=args, shared_mem=need)
        return
    import ctypes

    from torch.cuda._utils import _check_cuda, _get_gpu_runtime_library
    values: list[Any] = []
    for a in args:
        values.append(ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor)
                      else ctypes.c_int(a) if isinstance(a, int) else ctypes.c_double(a))
    params = (ctypes.c_void_p * (len(values) + 1))(*[ctypes.addressof(v) for v in values], tensor_map(args[1]))
    _check_cuda(_get_gpu_runtime_library().cuLaunchKernel(k.func, grid[0], grid[1], 1, 256, 1, 1, need,
                                                          torch.cuda.current_stream()._as_parameter_, params, None))


def _check(qa: torch.Tensor, e8: torch.Tensor, e_scale: torch.Tensor) -> None:
    """ValueError unless ``qa [B, H, D]``, ``e8 [>=B, T, D]`` (float8_e4m3fn, contiguous) and
    ``e_scale [>=B, T]`` (float32, contiguous) fit together on one device."""
    ok = qa.dim() == 3 and e8.dim() == 3 and e_scale.dim() == 2 and e8.dtype == torch.float8_e4m3fn \
        and e_scale.dtype == torch.float32 and e8.is_contiguous() and e_scale.is_contiguous() \
        and e8.shape[0] >= qa.shape[0] and e8.shape[2] == qa.shape[2] and tuple(e_scale.shape) == tuple(e8.shape[:2]) \
        and qa.device == e8.device == e_scale.device
    if not ok:
        raise ValueError(f"absorbed_attend: qa {tuple(qa.shape)} ({qa.device}), e8 {tuple(e8.shape)} {e8.dtype} "
                         f"({e8.device}), e_scale {tuple(e_scale.shape)} {e_scale.dtype} ({e_scale.device}): needs "
                         "qa [B, H, D], a contiguous float8_e4m3fn e8 [>=B, T, D] and a contiguous float32 e_scale "
                         "of e8's first two sizes, on one device")


_default_builds: dict[int, str] = {}


def default_build(dev: int) -> str:
    """The build ``absorbed_attend`` runs on CUDA device ``dev`` when not told: the one named by
    the environment variable ``TIDESERVE_ABSORBED_BUILD`` (one of ``SERVED_BUILDS``: ``mma``,
    ``WGMMA``, ``WGMMA,WG_PROMOTE``, ``WGMMA,WG_SW128`` or ``WGMMA,WG_TMA``), else the
    warp-group kernel with tensor copies (``WGMMA,WG_TMA``) on sm_90 and the mma.sync kernel
    (``""``) elsewhere. Why: on an H100, 32 layers at 256 rows took 5.92 ms with it against
    9.25 with ``WGMMA``'s cp.async loads and 10.30 for the FP8 keys and values (4.78 / 3.08 at
    128 rows), matching its reference (``bench/results/gpu_absorbed_load_h100.json``,
    ``gpu_absorbed_load_check_h100.txt``). Read once per device. ValueError naming the accepted
    values for any other; RuntimeError (``_compiled``) at the first launch if the build cannot
    run on that GPU."""
    if dev not in _default_builds:
        v = os.environ.get(BUILD_ENV, "").strip()
        if not v:
            v = "WGMMA,WG_TMA" if torch.cuda.get_device_capability(dev) == (9, 0) else ""
        v = "" if v == "mma" else v
        if v not in SERVED_BUILDS:
            names = ", ".join(b or "mma" for b in SERVED_BUILDS)
            raise ValueError(f"{BUILD_ENV}={v!r}: use one of {names} (or leave it unset)")
        _default_builds[dev] = v
    return _default_builds[dev]


def absorbed_attend(qa: torch.Tensor, e8: torch.Tensor, e_scale: torch.Tensor, head_dim: int,
                    split: int = 1, diagnostic: str | None = None) -> torch.Tensor:
    """``qa [B, H, D]`` (bf16, each head's query times its key projection, ``q_h W_k,h``; its last
    dimension contiguous) over ``e8 [>=B, T, D]`` (float8_e4m3fn, contiguous; E's first B rows may
    be a view of a larger cache) with ``e_scale [>=B, T]`` (float32, contiguous, E ~= e8 *
    e_scale) -> ``u [B, H, D]`` in bf16, ``softmax(qa E^T / sqrt(head_dim)) E`` per row and head;
    the caller applies the value projection (``u_h W_v,h^T + b_v,h``). Whisper's widths (a
    multiple of 64 up to 1280) and at most 24 heads; ``split`` parts of T per row, combined after.
    ValueError for other shapes, strides, dtypes or devices; static shapes and no host
    synchronisation (CUDA-graph safe once compiled: call it once before capture). On CPU tensors
    it runs ``absorbed_attend_reference``. ``diagnostic``: the build (``_compiled``; None:
    ``default_build``): ``""`` (the mma.sync kernel), ``WGMMA`` (the warp-group kernel, sm_90
    only; with ``WG_TMA`` the default there), a candidate, or one with parts left out, whose output is
    meaningless, for timing the rest."""
    _check(qa, e8, e_scale)
    if qa.device.type == "cpu":
        return absorbed_attend_reference(qa, e8, e_scale, head_dim)
    b, h, d = qa.shape
    t = e8.shape[1]
    if d % 64 or d > 1280 or h > 24 or split < 1 or qa.dtype != torch.bfloat16 or qa.stride(2) != 1 \
            or qa.stride(0) % 8 or qa.stride(1) % 8 or qa.data_ptr() % 16 or e8.data_ptr() % 16:
        raise ValueError(f"absorbed_attend: qa {tuple(qa.shape)} {qa.dtype} with strides {qa.stride()}, split {split}: "
                         "the kernel takes bf16 qa of a width that is a multiple of 64 up to 1280 and <= 24 heads, "
                         "its last dimension contiguous, rows and heads 16-byte aligned, and split >= 1")
    if b == 0:
        return qa.new_empty((0, h, d))
    if t == 0:  # no positions: as the kernels' empty loop leaves it (and a tensor map cannot have a size 0)
        return qa.new_zeros((b, h, d))
    hp = (h + 7) // 8 * 8
    es = e_scale[:b]
    if split == 1:
        out = torch.empty((b, h, d), dtype=torch.bfloat16, device=qa.device)
        part = out
    else:
        part = torch.empty((b, split, h, d + 2), dtype=torch.float32, device=qa.device)
        out = part
    with torch.cuda.device(qa.device):
        build = default_build(torch.cuda.current_device()) if diagnostic is None else diagnostic
        _launch(d, hp, (b, split), [qa, e8, es, out, part, h, t, split, qa.stride(0), qa.stride(1),
                                     head_dim ** -0.5 * 1.4426950408889634], build)
    if split == 1:
        return out
    acc, m, denom = part[..., :d], part[..., d], part[..., d + 1]  # [B, S, H, D], [B, S, H], [B, S, H]
    w = torch.exp2(m - m.amax(dim=1, keepdim=True))
    return ((acc * w[..., None]).sum(dim=1) / (denom * w).sum(dim=1)[..., None]).to(torch.bfloat16)


def absorbed_attend_reference(qa: torch.Tensor, e8: torch.Tensor, e_scale: torch.Tensor, head_dim: int) -> torch.Tensor:
    """What the kernel computes, in PyTorch (float32 but for the kernel's two FP8 roundings, qa's per
    head and P's; P's against the row's largest probability where the kernel rounds it against
    the largest so far, block by block): ``qa [B, H, D]``, ``e8 [>=B, T, D]``, ``e_scale [>=B,
    T]`` -> ``u [B, H, D]`` in qa's dtype. For the CPU (tests) and for checking the kernel."""
    b = qa.shape[0]
    e = e8[:b].float()                                                         # [B, T, D]
    es = e_scale[:b].float()                                                   # [B, T]
    sc = torch.clamp(qa.float().abs().amax(dim=2, keepdim=True) / E4M3_MAX, min=1e-12)  # [B, H, 1]
    q8 = (qa.float() / sc).to(torch.float8_e4m3fn).float()
    scores = (q8 @ e.transpose(1, 2)) * sc * es[:, None, :] * head_dim ** -0.5  # [B, H, T]
    p = torch.exp(scores - scores.amax(dim=2, keepdim=True))
    emax = es.amax(dim=1)[:, None, None]                                       # [B, 1, 1]
    p8 = (p * es[:, None, :] * (E4M3_MAX / emax)).to(torch.float8_e4m3fn).float()
    return ((p8 @ e) * (emax / E4M3_MAX) / p.sum(dim=2, keepdim=True)).to(qa.dtype)


def quantize_positions_into(x: torch.Tensor, e8: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """``x [B, T, D]`` into ``e8 [N, T, D]`` (float8_e4m3fn) and ``scale [N, T]`` (float32) at rows
    ``[:B]`` or at the rows listed by ``rows`` (``[B]`` int64): ``x ~= e8 * scale[..., None]``, one
    scale a position, ``amax(|x[b, t]|) / 448``, never 0. ValueError for mismatched shapes."""
    if x.dim() != 3 or e8.shape[1:] != x.shape[1:] or scale.shape != e8.shape[:2]:
        raise ValueError(f"quantize_positions_into: x {tuple(x.shape)} does not fit e8 {tuple(e8.shape)} "
                         f"and scale {tuple(scale.shape)}")
    s = torch.clamp(x.abs().amax(dim=2).float() / E4M3_MAX, min=1e-12)
    x8 = (x.float() / s[..., None]).to(torch.float8_e4m3fn)
    if rows is None:
        e8[: x.shape[0]].copy_(x8)
        scale[: x.shape[0]].copy_(s)
    else:
        e8.view(torch.uint8).index_copy_(0, rows, x8.view(torch.uint8))  # no index_copy_ for float8 types
        scale.index_copy_(0, rows, s)


@torch.library.custom_op("tideserve::absorbed_attend", mutates_args=())
def absorbed_attend_op(qa: torch.Tensor, e8: torch.Tensor, e_scale: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``absorbed_attend`` as a custom operator: under ``torch.compile`` Inductor calls it as it is
    (it cannot trace an NVRTC launch)."""
    return absorbed_attend(qa, e8, e_scale, head_dim)


@absorbed_attend_op.register_fake
def _absorbed_attend_shape(qa: torch.Tensor, e8: torch.Tensor, e_scale: torch.Tensor, head_dim: int) -> torch.Tensor:
    return qa.new_empty(qa.shape)
