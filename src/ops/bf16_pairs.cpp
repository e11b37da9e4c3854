// bf16 pair-packed products with AVX512_BF16 (see ops/bf16_pairs.h). Every function carries the
// target attribute below instead of file-wide -m flags, so no inline function this file instantiates is compiled
// for AVX-512 behind the back of the rest of the binary (it runs on AVX2-only CPUs too).
#include "ops/bf16_pairs.h"

#include <algorithm>

#include "core/error.h"
#include "ops/matmul.h"
#include "ops/precision.h"
#include "ops/thread_scratch.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "ops/avx512_masks.h"
#include "ops/transpose16.h"

// GCC 12's AVX-512 unpack/shuffle intrinsics start from _mm512_undefined_ps(): a false -Wmaybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define HLM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace hlm::ops::bf16_pairs {
namespace {

// Same-size vector casts reinterpret the bits (GCC and clang vector extensions).
HLM_BF16_TARGET inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }
HLM_BF16_TARGET inline __m512i as_si(__m512bh v) { return (__m512i)v; }

// The microkernel: C[MR x n] (+)= A B over K2 pairs, n = 16 (NV - 1) + n_last columns (FULL: n_last == 16).
template <int MR, int NV, bool FULL>
HLM_BF16_TARGET void mk(i64 K2, const Pair* A, i64 a_rs, i64 a_ks, const Pair* B, i64 ldb, float* C, i64 ldc,
                        i64 n_last, bool acc) {
  const __mmask16 last = first_lanes(n_last);
  __m512 c[MR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const float* p = C + r * ldc + 16 * v;
      c[r][v] = !acc                     ? _mm512_setzero_ps()
                : (!FULL && v == NV - 1) ? _mm512_maskz_loadu_ps(last, p)
                                         : _mm512_loadu_ps(p);
    }
  for (i64 k = 0; k < K2; ++k) {
    const Pair* b = B + k * ldb;
    const Pair* a = A + k * a_ks;
    __m512i bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = (!FULL && v == NV - 1) ? _mm512_maskz_loadu_epi32(last, b + 16 * v) : _mm512_loadu_si512(b + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(a[r * a_rs]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], as_bh(av), as_bh(bv[v]));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* p = C + r * ldc + 16 * v;
      if (!FULL && v == NV - 1)
        _mm512_mask_storeu_ps(p, last, c[r][v]);
      else
        _mm512_storeu_ps(p, c[r][v]);
    }
}

using MkFn = void (*)(i64, const Pair*, i64, i64, const Pair*, i64, float*, i64, i64, bool);
template <int MR, int NV>
constexpr MkFn mk_pair[2] = {mk<MR, NV, false>, mk<MR, NV, true>};
template <int MR>
constexpr const MkFn* mk_row[4] = {mk_pair<MR, 1>, mk_pair<MR, 2>, mk_pair<MR, 3>, mk_pair<MR, 4>};
constexpr const MkFn* const* mk_table[4] = {mk_row<1>, mk_row<2>, mk_row<3>, mk_row<4>};

// 16 columns of rows a (low halves) and b (high halves) as 16 pair words.
HLM_BF16_TARGET inline __m512i interleave(__m512 a, __m512 b) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512bh ab = _mm512_cvtne2ps_pbh(b, a);  // bf16 lanes 0-15: a, 16-31: b
  return _mm512_permutexvar_epi16(idx, as_si(ab));
}

// 16 floats at p, times vm when scale (without it the values are the same: x * 1 == x, and the conversion below
// treats subnormals as zero either way).
HLM_BF16_TARGET inline __m512 load16(const float* p, __m512 vm, bool scale) {
  const __m512 v = _mm512_loadu_ps(p);
  return scale ? _mm512_mul_ps(v, vm) : v;
}

// One row rounded: 2 * np columns into np pair words (columns beyond `cols` read as zero). Whole vectors take plain
// loads and stores (most of the packing passes' time); only a tail builds lane masks.
HLM_BF16_TARGET inline void round_row(const float* src, i64 cols, __m512 vm, bool scale, Pair* dst, i64 np) {
  i64 p0 = 0;
  for (; 2 * p0 + 32 <= cols && p0 + 16 <= np; p0 += 16) {
    const __m512bh r = _mm512_cvtne2ps_pbh(load16(src + 2 * p0 + 16, vm, scale), load16(src + 2 * p0, vm, scale));
    _mm512_storeu_si512(dst + p0, as_si(r));
  }
  for (; p0 < np; p0 += 16) {
    const i64 c0 = 2 * p0;
    const __m512 lo = _mm512_mul_ps(_mm512_maskz_loadu_ps(first_lanes(std::max<i64>(cols - c0, 0)), src + c0), vm);
    const __m512 hi =
        _mm512_mul_ps(_mm512_maskz_loadu_ps(first_lanes(std::max<i64>(cols - c0 - 16, 0)), src + c0 + 16), vm);
    const __m512bh r = _mm512_cvtne2ps_pbh(hi, lo);
    _mm512_mask_storeu_epi32(dst + p0, first_lanes(np - p0), as_si(r));
  }
}

}  // namespace

bool available() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return has;
}

bool active() { return precision() == Precision::bf16 && available(); }

HLM_BF16_TARGET void block(int mr, i64 N, i64 K2, const Pair* A, i64 a_rs, i64 a_ks, const Pair* B, i64 ldb, float* C,
                           i64 ldc, bool acc) {
  for (i64 c0 = 0; c0 < N; c0 += 64) {
    const i64 n = std::min<i64>(64, N - c0), nv = (n + 15) / 16, n_last = n - 16 * (nv - 1);
    mk_table[mr - 1][nv - 1][n_last == 16](K2, A, a_rs, a_ks, B + c0, ldb, C + c0, ldc, n_last, acc);
  }
}

HLM_BF16_TARGET void round_rows(const float* src, i64 stride, int n, i64 cols, float mul, Pair* dst, i64 ldd) {
  const __m512 vm = _mm512_set1_ps(mul);
  for (int r = 0; r < n; ++r) round_row(src + r * stride, cols, vm, mul != 1.f, dst + r * ldd, (cols + 1) / 2);
}

HLM_BF16_TARGET void round_rows_t(const float* src, i64 stride, int n, i64 cols, float mul, Pair* dst, i64 ldd,
                                  int n_out) {
  const i64 np = (cols + 1) / 2;
  const __m512 vm = _mm512_set1_ps(mul);
  alignas(64) Pair rows[16 * 16];
  for (int r0 = 0; r0 < n_out; r0 += 16) {
    const __mmask16 out = first_lanes(n_out - r0);
    for (i64 p0 = 0; p0 < np; p0 += 16) {
      // 16 rows x 16 pair words, transposed in registers.
      const i64 nw = std::min<i64>(16, np - p0);
      __m512 a[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        if (r0 + i < n) {
          round_row(src + (r0 + i) * stride + 2 * p0, std::min<i64>(2 * nw, cols - 2 * p0), vm, mul != 1.f,
                    rows + 16 * i, 16);
          a[i] = _mm512_load_ps(reinterpret_cast<const float*>(rows + 16 * i));
        } else {
          a[i] = _mm512_setzero_ps();
        }
      }
      transpose16(a);
      for (i64 i = 0; i < nw; ++i)
        _mm512_mask_storeu_ps(reinterpret_cast<float*>(dst + (p0 + i) * ldd + r0), out, a[i]);
    }
  }
}

HLM_BF16_TARGET void pair_rows(const float* src, i64 stride, int r_lo, int r_hi, int p0, int p1, i64 cols, Pair* dst,
                               i64 ldd, float mul) {
  const __m512 vm = _mm512_set1_ps(mul);
  const bool scale = mul != 1.f;
  for (int p = p0; p < p1; ++p) {
    const int ra = 2 * p, rb = 2 * p + 1;
    const bool has_a = ra >= r_lo && ra <= r_hi, has_b = rb >= r_lo && rb <= r_hi;
    // Rows outside [r_lo, r_hi] are never read (nor pointed at: they may lie outside the buffer).
    const float *a_row = has_a ? src + ra * stride : src, *b_row = has_b ? src + rb * stride : src;
    i64 c0 = 0;
    if (has_a && has_b)  // whole vectors of two present rows: no masks (see round_row)
      for (; c0 + 16 <= cols; c0 += 16)
        _mm512_storeu_si512(dst + p * ldd + c0,
                            interleave(load16(a_row + c0, vm, scale), load16(b_row + c0, vm, scale)));
    for (; c0 < cols; c0 += 16) {
      const __mmask16 m = first_lanes(cols - c0);
      const __m512 a = has_a ? _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a_row + c0), vm) : _mm512_setzero_ps();
      const __m512 b = has_b ? _mm512_mul_ps(_mm512_maskz_loadu_ps(m, b_row + c0), vm) : _mm512_setzero_ps();
      _mm512_mask_storeu_epi32(dst + p * ldd + c0, m, interleave(a, b));
    }
  }
}

void gemm(bool ta, bool tb, i64 M, i64 N, i64 K, float alpha, const float* A, i64 lda, const float* B, i64 ldb,
          float beta, float* C, i64 ldc) {
  if (!matmul_needs_product("bf16_pairs::gemm", ta, tb, M, N, K, lda, ldb, beta, C, ldc)) return;
  HLM_CHECK(M < (i64{1} << 30) && K < (i64{1} << 30), "bf16_pairs::gemm: too large M={} K={}", M, K);
  if (beta != 0.f && beta != 1.f)  // block() overwrites or adds
    for (i64 i = 0; i < M; ++i)
      for (i64 j = 0; j < N; ++j) C[i * ldc + j] *= beta;
  // op(A) as pairs along K (alpha folded in) and op(B) as [K2, N] pairs, in slots the attention kernels leave free.
  const i64 K2 = (K + 1) / 2;
  Pair* ap = thread_scratch<Pair>(14, M * K2);
  Pair* bp = thread_scratch<Pair>(15, K2 * N);
  i64 a_rs, a_ks;
  if (!ta) {
    round_rows(A, lda, static_cast<int>(M), K, alpha, ap, K2);
    a_rs = K2, a_ks = 1;
  } else {
    pair_rows(A, lda, 0, static_cast<int>(K) - 1, 0, static_cast<int>(K2), M, ap, M, alpha);
    a_rs = 1, a_ks = M;
  }
  if (!tb)
    pair_rows(B, ldb, 0, static_cast<int>(K) - 1, 0, static_cast<int>(K2), N, bp, N);
  else
    round_rows_t(B, ldb, static_cast<int>(N), K, 1.f, bp, N, static_cast<int>(N));
  product(M, N, K2, ap, a_rs, a_ks, bp, N, C, ldc, beta != 0.f);
}

}  // namespace hlm::ops::bf16_pairs

#else  // not x86-64: never available, so never called

namespace hlm::ops::bf16_pairs {

bool available() { return false; }
bool active() { return false; }

[[noreturn]] static void unavailable() { throw Error("attention bf16 products need x86-64 with AVX512_BF16"); }
void block(int, i64, i64, const Pair*, i64, i64, const Pair*, i64, float*, i64, bool) { unavailable(); }
void round_rows(const float*, i64, int, i64, float, Pair*, i64) { unavailable(); }
void round_rows_t(const float*, i64, int, i64, float, Pair*, i64, int) { unavailable(); }
void pair_rows(const float*, i64, int, int, int, int, i64, Pair*, i64, float) { unavailable(); }
void gemm(bool, bool, i64, i64, i64, float, const float*, i64, const float*, i64, float, float*, i64) { unavailable(); }

}  // namespace hlm::ops::bf16_pairs

#endif
