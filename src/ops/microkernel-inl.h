// The register-blocked fp32 product the hand-written kernels are built from (ops/attention.cpp, ops/small_gemm.cpp):
// C[mr x N] (+)= A[mr x K] B[K x N] for up to 4 rows of A, each element of A broadcast, B read a row of vectors at a
// time, the 4 x up to 4 accumulator vectors kept in registers; and the transposed copy that turns rows into the
// columns of such a B. Included from inside a foreach_target translation unit, so it has a per-target include guard
// instead of #pragma once.
#if defined(HLM_OPS_MICROKERNEL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HLM_OPS_MICROKERNEL_INL_H_
#undef HLM_OPS_MICROKERNEL_INL_H_
#else
#define HLM_OPS_MICROKERNEL_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>

#include "core/tensor.h"
#include "ops/simd_math-inl.h"
#include "ops/avx512_masks.h"  // x86-64 only, used on the AVX3 targets
#include "ops/transpose16.h"     // likewise

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE::micro {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 16>;  // at most 16 columns per vector, so the attention tiles work in 16-column groups
using VF = hn::Vec<DF>;

// Accumulator vectors per microkernel pass: 4 rows x kMaxNV vectors must fit the register file with the B row
// and a broadcast (16 registers on AVX2/SSE4, 32 on AVX-512 and NEON).
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
constexpr int kMaxNV = 3;
#else
constexpr int kMaxNV = 4;
#endif

// Keeps a loaded vector in its register. Without this GCC 12 folds each load of B into every FMA that reads it (a
// memory operand), so a 4 x 4 step issues 16 vector loads and 4 broadcasts for its 16 FMAs, and the loads, not the
// FMAs, set the pace: ~80% of the FMA peak on Zen 4, which loads one 512-bit vector a cycle (Intel cores load two
// a cycle for their two FMAs: the same ratio). With B pinned: 4 loads and 4 broadcasts (docs/performance.md, "The
// micro-kernel's loads").
HWY_INLINE void pin_register(VF& v) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR
  asm("" : "+v"(v.raw));
#else
  (void)v;  // NEON's FMA has no memory operand
#endif
}

// C[MR x n] (+)= A[MR x K] B[K x n], n = L*(NV-1) + n_last. A element (row r, k) is A[r*a_rs + k*a_ks] (so A^T is
// a_rs = 1); B is row-major with row stride ldb. FULL: the last vector is whole (n_last == L), so no masked loads
// and stores.
template <int MR, int NV, bool FULL>
void mk(i64 K, const float* A, i64 a_rs, i64 a_ks, const float* B, i64 ldb, float* C, i64 ldc, size_t n_last,
        bool acc) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const auto last = hn::FirstN(d, n_last);
  // Unrolled explicitly: otherwise GCC 12 keeps c[][] on the stack and stores it every k (2.5x slower).
  VF c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* p = C + r * ldc + L * v;
      c[r][v] = !acc ? hn::Zero(d) : (!FULL && v == NV - 1) ? load_first(d, last, p, n_last) : hn::LoadU(d, p);
    }
  for (i64 k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    const float* a = A + k * a_ks;
    VF bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      bv[v] = (!FULL && v == NV - 1) ? load_first(d, last, b + L * v, n_last) : hn::LoadU(d, b + L * v);
      pin_register(bv[v]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const VF av = hn::Set(d, a[r * a_rs]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = hn::MulAdd(av, bv[v], c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* p = C + r * ldc + L * v;
      if (!FULL && v == NV - 1)
        store_first(d, c[r][v], last, p, n_last);
      else
        hn::StoreU(c[r][v], d, p);
    }
}

using MkFn = void (*)(i64, const float*, i64, i64, const float*, i64, float*, i64, size_t, bool);
template <int MR, int NV>
inline constexpr MkFn mk_pair[2] = {mk<MR, NV, false>, mk<MR, NV, true>};
template <int MR>
inline constexpr const MkFn* mk_row[4] = {mk_pair<MR, 1>, mk_pair<MR, 2>, mk_pair<MR, 3>, mk_pair<MR, 4>};
inline constexpr const MkFn* const* mk_table[4] = {mk_row<1>, mk_row<2>, mk_row<3>, mk_row<4>};

// C[mr x N] (+)= A[mr x K] B[K x N] for mr in 1..4 rows and N >= 1 columns, in passes of kMaxNV vectors.
inline void block(int mr, i64 N, i64 K, const float* A, i64 a_rs, i64 a_ks, const float* B, i64 ldb, float* C, i64 ldc,
                  bool acc) {
  const i64 L = static_cast<i64>(hn::Lanes(DF()));
  for (i64 c0 = 0; c0 < N; c0 += kMaxNV * L) {
    const i64 n = std::min<i64>(kMaxNV * L, N - c0), nv = (n + L - 1) / L, n_last = n - L * (nv - 1);
    mk_table[mr - 1][nv - 1][n_last == L](K, A, a_rs, a_ks, B + c0, ldb, C + c0, ldc, static_cast<size_t>(n_last),
                                           acc);
  }
}

// dst[k * ldd + j] = mul * src[j * stride + k] for k < K and j < n, and 0 for n <= j < n_pad: n rows of src become
// the first n columns of dst, zero padded to n_pad columns.
inline void transpose_rows(const float* src, i64 stride, i64 n, i64 n_pad, i64 K, float mul, float* dst, i64 ldd) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // 16 x 16 blocks transposed in registers (Highway 1.0 has no 16-lane transpose); edges through lane masks.
  const __m512 vm = _mm512_set1_ps(mul);
  for (i64 j0 = 0; j0 < n_pad; j0 += 16)
    for (i64 k0 = 0; k0 < K; k0 += 16) {
      const i64 nj = std::min<i64>(16, n_pad - j0), nk = std::min<i64>(16, K - k0);
      const __mmask16 km = first_lanes(nk), jm = first_lanes(nj);
      __m512 a[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        a[i] = j0 + i < n ? _mm512_mul_ps(_mm512_maskz_loadu_ps(km, src + (j0 + i) * stride + k0), vm)
                          : _mm512_setzero_ps();
      transpose16(a);
      for (i64 i = 0; i < nk; ++i) _mm512_mask_storeu_ps(dst + (k0 + i) * ldd + j0, jm, a[i]);
    }
#else
  for (i64 k = 0; k < K; ++k)
    for (i64 j = 0; j < n_pad; ++j) dst[k * ldd + j] = j < n ? src[j * stride + k] * mul : 0.f;
#endif
}

}  // namespace hlm::ops::HWY_NAMESPACE::micro
HWY_AFTER_NAMESPACE();

#endif  // HLM_OPS_MICROKERNEL_INL_H_
