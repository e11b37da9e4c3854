// Elementwise pieces of the chunked scans on Google Highway, one copy per SIMD target (ops/scan_simd.h).
#include "ops/scan_simd.h"

#include "core/error.h"
#include "core/simd_target.h"

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/scan_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;

template <typename Real>
void unit_lower_inverse_t(const Real* A, const Real* Gam, const Real* beta, Real* Tm, i64 L, i64 C) {
  const hn::ScalableTag<Real> d;
  using V = hn::Vec<decltype(d)>;
  const i64 N = static_cast<i64>(hn::Lanes(d)), nv = 16 / N;  // vectors per 16-column block (N <= 16)
  for (i64 i = 0; i < L; ++i) {
    Real* ti = Tm + i * C;
    const Real* Ai = A + i * C;
    const Real* Gi = Gam + i * C;
    for (i64 jb = 0; jb < i; jb += 16) {
      V acc[16];
      for (i64 v = 0; v < nv; ++v) acc[v] = hn::Zero(d);
      for (i64 m = jb; m < i; ++m) {
        const V c = hn::Set(d, beta[i] * Ai[m] * Gi[m]);
        const Real* tm = Tm + m * C + jb;
        for (i64 v = 0; v < nv; ++v) acc[v] = hn::MulAdd(c, hn::LoadU(d, tm + v * N), acc[v]);
      }
      for (i64 v = 0; v < nv; ++v) hn::StoreU(hn::Neg(acc[v]), d, ti + jb + v * N);
    }
    ti[i] = 1;
    for (i64 j = i + 1; j < C; ++j) ti[j] = 0;
  }
}

}  // namespace

void exp_inplace_impl(float* x, i64 n) {
  const hn::ScalableTag<float> d;
  for_each_vector(d, n, [&](i64 i, size_t c) { store_part(d, exp(d, load_part(d, x + i, c)), x + i, c); });
}

void unit_lower_inverse_f32(const float* A, const float* Gam, const float* beta, float* T, i64 L, i64 C) {
  unit_lower_inverse_t(A, Gam, beta, T, L, C);
}
void unit_lower_inverse_f64(const double* A, const double* Gam, const double* beta, double* T, i64 L, i64 C) {
  unit_lower_inverse_t(A, Gam, beta, T, L, C);
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm::ops {

HWY_EXPORT(exp_inplace_impl);
HWY_EXPORT(unit_lower_inverse_f32);
HWY_EXPORT(unit_lower_inverse_f64);

void exp_inplace_simd(float* x, i64 n) {
  init_simd();
  HWY_DYNAMIC_DISPATCH(exp_inplace_impl)(x, n);
}

void unit_lower_inverse(const float* A, const float* Gamma, const float* beta, float* T, i64 L, i64 C) {
  HLM_CHECK(L >= 0 && C % 16 == 0 && L <= C, "unit_lower_inverse: L={} C={} (C must be a multiple of 16, >= L)", L, C);
  init_simd();
  HWY_DYNAMIC_DISPATCH(unit_lower_inverse_f32)(A, Gamma, beta, T, L, C);
}

void unit_lower_inverse(const double* A, const double* Gamma, const double* beta, double* T, i64 L, i64 C) {
  HLM_CHECK(L >= 0 && C % 16 == 0 && L <= C, "unit_lower_inverse: L={} C={} (C must be a multiple of 16, >= L)", L, C);
  init_simd();
  HWY_DYNAMIC_DISPATCH(unit_lower_inverse_f64)(A, Gamma, beta, T, L, C);
}

}  // namespace hlm::ops
#endif  // HWY_ONCE
