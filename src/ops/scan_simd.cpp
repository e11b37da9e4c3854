// Elementwise pieces of the chunked scans on Google Highway, one copy per SIMD target (ops/scan_simd.h).
#include "ops/scan_simd.h"

#include <algorithm>

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


// ---- row operations (ops/scan_simd.h); rows in whole vectors plus a masked tail (for_each_vector) ----

template <typename T>
void axpy_t(T a, const T* x, T* y, i64 n) {
  axpy_row(hn::ScalableTag<T>(), a, x, y, n);
}

template <typename T>
void mul_inplace_t(T* y, const T* x, i64 n) {
  const hn::ScalableTag<T> d;
  for_each_vector(d, n, [&](i64 i, size_t c) {
    store_part(d, hn::Mul(load_part(d, y + i, c), load_part(d, x + i, c)), y + i, c);
  });
}

template <typename T>
void scale_rows_t(T s0, const T* s, const T* src, i64 lds, T* dst, i64 ldd, i64 m, i64 n) {
  const hn::ScalableTag<T> d;
  for (i64 r = 0; r < m; ++r) scale_row(d, s ? T(s0 * s[r]) : s0, src + r * lds, dst + r * ldd, n);
}

template <typename T>
void axpy_rows_t(const T* s, const T* src, i64 lds, T* dst, i64 ldd, i64 m, i64 n) {
  for (i64 r = 0; r < m; ++r) axpy_t(s[r], src + r * lds, dst + r * ldd, n);
}

template <typename T>
void lower_product_t(const T* a, const T* b, T* out, i64 L, i64 ld) {
  const hn::ScalableTag<T> d;
  for (i64 r = 0; r < L; ++r) {
    const T *ar = a + r * ld, *br = b + r * ld;
    T* o = out + r * ld;
    for_each_vector(d, r + 1, [&](i64 i, size_t c) {
      store_part(d, hn::Mul(load_part(d, ar + i, c), load_part(d, br + i, c)), o + i, c);
    });
    std::fill(o + r + 1, o + L, T(0));
  }
}

template <typename T>
void decay_band_grads_t(const T* dP, const T* Gm, const T* A, T* dPG, T* colsum, double* dgam, i64 n) {
  const hn::ScalableTag<T> d;
  std::fill(colsum, colsum + n, T(0));
  for (i64 r = 0; r < n; ++r) {
    const T *dpr = dP + r * n, *gr = Gm + r * n, *ar = A + r * n;
    T* acc = dPG + r * n;
    auto rs = hn::Zero(d);
    for_each_vector(d, r, [&](i64 j, size_t c) {
      const auto x = hn::Mul(load_part(d, dpr + j, c), load_part(d, gr + j, c));
      store_part(d, hn::Add(load_part(d, acc + j, c), x), acc + j, c);
      const auto rr = hn::Mul(x, load_part(d, ar + j, c));  // zero in a tail's missing lanes
      rs = hn::Add(rs, rr);
      store_part(d, hn::Add(load_part(d, colsum + j, c), rr), colsum + j, c);
    });
    acc[r] += dpr[r];  // Gamma_ii = 1
    dgam[r] += sum_lanes(d, rs);
  }
  for (i64 r = 0; r < n; ++r) dgam[r] -= colsum[r];
}

template <typename T>
void delta_a0_grads_t(const T* dM, const T* Gm, const T* A, const T* bt, T* Z, T* B, T* dbt, i64 L, i64 ld) {
  const hn::ScalableTag<T> d;
  for (i64 r = 0; r < L; ++r) {
    const T *dmr = dM + r * ld, *gr = Gm + r * ld, *ar = A + r * ld;
    T *zr = Z + r * ld, *brow = B + r * ld;
    const auto vb = hn::Set(d, bt[r]);
    auto db = hn::Zero(d);
    for_each_vector(d, r, [&](i64 j, size_t c) {
      const auto da0 = hn::Mul(load_part(d, dmr + j, c), load_part(d, gr + j, c));
      const auto a = load_part(d, ar + j, c);
      db = hn::MulAdd(da0, a, db);
      const auto cb = hn::Mul(da0, vb);
      store_part(d, hn::MulAdd(cb, a, load_part(d, zr + j, c)), zr + j, c);
      store_part(d, cb, brow + j, c);
    });
    dbt[r] = sum_lanes(d, db);
    brow[r] = 0;
  }
}

template <typename T>
void lower_row_minus_col_sums_t(const T* Z, T* dgam, i64 L, i64 ld) {
  const hn::ScalableTag<T> d;
  for (i64 r = 0; r < L; ++r) {
    const T* zr = Z + r * ld;
    auto rs = hn::Zero(d);
    for_each_vector(d, r, [&](i64 j, size_t c) {
      const auto z = load_part(d, zr + j, c);
      rs = hn::Add(rs, z);
      store_part(d, hn::Sub(load_part(d, dgam + j, c), z), dgam + j, c);
    });
    dgam[r] += sum_lanes(d, rs);
  }
}

// ---- the linear mixers' recurrent token step (decoding) on a state S [K, V] ----
// Columns go in blocks of up to kStepBlock vectors whose sums stay in registers while the rows stream past, so S is
// read (and written) once per call; every column's sum runs over the rows in order, as the plain loops do.
constexpr i64 kStepBlock = 4;

// The vectors of the column block starting at j0 (of V columns): how many (returned) and their element counts.
inline i64 step_block(i64 V, i64 j0, i64 N, size_t* cnt) {
  const i64 nb = std::min<i64>(kStepBlock, (V - j0 + N - 1) / N);
  for (i64 b = 0; b < nb; ++b) cnt[b] = static_cast<size_t>(std::min(N, V - j0 - b * N));
  return nb;
}

template <typename T>
void state_transpose_products_t(const T* S, i64 K, i64 V, const T* x, const T* y, T* Sx, T* Sy) {
  const hn::ScalableTag<T> d;
  using Vec = hn::Vec<decltype(d)>;
  const i64 N = static_cast<i64>(hn::Lanes(d));
  for (i64 j0 = 0; j0 < V; j0 += kStepBlock * N) {
    size_t cnt[kStepBlock];
    const i64 nb = step_block(V, j0, N, cnt);
    Vec ax[kStepBlock], ay[kStepBlock];
    for (i64 b = 0; b < nb; ++b) ax[b] = ay[b] = hn::Zero(d);
    for (i64 i = 0; i < K; ++i) {
      const T* row = S + i * V + j0;
      const Vec xi = hn::Set(d, x[i]), yi = hn::Set(d, y ? y[i] : T(0));
      for (i64 b = 0; b < nb; ++b) {
        const Vec s = load_part(d, row + b * N, cnt[b]);
        ax[b] = hn::MulAdd(xi, s, ax[b]);
        if (y) ay[b] = hn::MulAdd(yi, s, ay[b]);
      }
    }
    for (i64 b = 0; b < nb; ++b) {
      store_part(d, ax[b], Sx + j0 + b * N, cnt[b]);
      if (y) store_part(d, ay[b], Sy + j0 + b * N, cnt[b]);
    }
  }
}

template <typename T>
void state_decay_rank1_t(T* S, i64 K, i64 V, T a, const T* x, const T* u, T qs, const T* q, T* o) {
  const hn::ScalableTag<T> d;
  using Vec = hn::Vec<decltype(d)>;
  const i64 N = static_cast<i64>(hn::Lanes(d));
  const Vec av = hn::Set(d, a);
  for (i64 j0 = 0; j0 < V; j0 += kStepBlock * N) {
    size_t cnt[kStepBlock];
    const i64 nb = step_block(V, j0, N, cnt);
    Vec uv[kStepBlock], acc[kStepBlock];
    for (i64 b = 0; b < nb; ++b) {
      uv[b] = load_part(d, u + j0 + b * N, cnt[b]);
      acc[b] = hn::Zero(d);
    }
    for (i64 i = 0; i < K; ++i) {
      T* row = S + i * V + j0;
      const Vec xi = hn::Set(d, x[i]), qi = hn::Set(d, q ? T(qs * q[i]) : T(0));
      for (i64 b = 0; b < nb; ++b) {
        // a == 0 overwrites: a reset must not carry a non-finite old state (0 * inf).
        const Vec s = a == T(0) ? hn::Mul(xi, uv[b])
                                : hn::MulAdd(xi, uv[b], hn::Mul(av, load_part(d, row + b * N, cnt[b])));
        store_part(d, s, row + b * N, cnt[b]);
        if (q) acc[b] = hn::MulAdd(qi, s, acc[b]);
      }
    }
    if (q)
      for (i64 b = 0; b < nb; ++b) store_part(d, acc[b], o + j0 + b * N, cnt[b]);
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

// Per-type entry points for HWY_EXPORT (which takes plain function names).
#define HLM_SCAN_ROW_OPS(T, sfx)                                                                                 \
  void axpy_##sfx(T a, const T* x, T* y, i64 n) { axpy_t(a, x, y, n); }                                          \
  void mul_inplace_##sfx(T* y, const T* x, i64 n) { mul_inplace_t(y, x, n); }                                    \
  void scale_rows_##sfx(T s0, const T* s, const T* src, i64 lds, T* dst, i64 ldd, i64 m, i64 n) {                \
    scale_rows_t(s0, s, src, lds, dst, ldd, m, n);                                                               \
  }                                                                                                              \
  void axpy_rows_##sfx(const T* s, const T* src, i64 lds, T* dst, i64 ldd, i64 m, i64 n) {                       \
    axpy_rows_t(s, src, lds, dst, ldd, m, n);                                                                    \
  }                                                                                                              \
  void lower_product_##sfx(const T* a, const T* b, T* out, i64 L, i64 ld) { lower_product_t(a, b, out, L, ld); } \
  void decay_band_grads_##sfx(const T* dP, const T* Gm, const T* A, T* dPG, T* cs, double* dgam, i64 n) {        \
    decay_band_grads_t(dP, Gm, A, dPG, cs, dgam, n);                                                             \
  }                                                                                                              \
  void delta_a0_grads_##sfx(const T* dM, const T* Gm, const T* A, const T* bt, T* Z, T* B, T* dbt, i64 L,        \
                            i64 ld) {                                                                            \
    delta_a0_grads_t(dM, Gm, A, bt, Z, B, dbt, L, ld);                                                           \
  }                                                                                                              \
  void lower_row_minus_col_sums_##sfx(const T* Z, T* dgam, i64 L, i64 ld) {                                    \
    lower_row_minus_col_sums_t(Z, dgam, L, ld);                                                                  \
  }                                                                                                              \
  void state_transpose_products_##sfx(const T* S, i64 K, i64 V, const T* x, const T* y, T* Sx, T* Sy) {          \
    state_transpose_products_t(S, K, V, x, y, Sx, Sy);                                                           \
  }                                                                                                              \
  void state_decay_rank1_##sfx(T* S, i64 K, i64 V, T a, const T* x, const T* u, T qs, const T* q, T* o) {        \
    state_decay_rank1_t(S, K, V, a, x, u, qs, q, o);                                                             \
  }
HLM_SCAN_ROW_OPS(float, f32)
HLM_SCAN_ROW_OPS(double, f64)
#undef HLM_SCAN_ROW_OPS

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

#define HLM_SCAN_ROW_OPS(T, sfx)                                                                               \
  HWY_EXPORT(axpy_##sfx);                                                                                      \
  HWY_EXPORT(mul_inplace_##sfx);                                                                               \
  HWY_EXPORT(scale_rows_##sfx);                                                                                \
  HWY_EXPORT(axpy_rows_##sfx);                                                                                 \
  HWY_EXPORT(lower_product_##sfx);                                                                             \
  HWY_EXPORT(decay_band_grads_##sfx);                                                                          \
  HWY_EXPORT(delta_a0_grads_##sfx);                                                                            \
  HWY_EXPORT(lower_row_minus_col_sums_##sfx);                                                                  \
  HWY_EXPORT(state_transpose_products_##sfx);                                                                  \
  HWY_EXPORT(state_decay_rank1_##sfx);                                                                         \
  void axpy(T a, const T* x, T* y, i64 n) {                                                                    \
    init_simd();                                                                                               \
    HWY_DYNAMIC_DISPATCH(axpy_##sfx)(a, x, y, n);                                                              \
  }                                                                                                            \
  void mul_inplace(T* y, const T* x, i64 n) {                                                                  \
    init_simd();                                                                                               \
    HWY_DYNAMIC_DISPATCH(mul_inplace_##sfx)(y, x, n);                                                          \
  }                                                                                                            \
  void scale_rows(T s0, const T* s, const T* src, i64 lds, T* dst, i64 ldd, i64 m, i64 n) {                    \
    init_simd();                                                                                               \
    HWY_DYNAMIC_DISPATCH(scale_rows_##sfx)(s0, s, src, lds, dst, ldd, m, n);                                   \
  }                                                                                                            \
  void axpy_rows(const T* s, const T* src, i64 lds, T* dst, i64 ldd, i64 m, i64 n) {                           \
    init_simd();                                                                                               \
    HWY_DYNAMIC_DISPATCH(axpy_rows_##sfx)(s, src, lds, dst, ldd, m, n);                                        \
  }                                                                                                            \
  void lower_product(const T* a, const T* b, T* out, i64 L, i64 ld) {                                          \
    init_simd();                                                                                               \
    HWY_DYNAMIC_DISPATCH(lower_product_##sfx)(a, b, out, L, ld);                                               \
  }                                                                                                            \
  void decay_band_grads(const T* dP, const T* Gm, const T* A, T* dPG, T* colsum, double* dgam, i64 n) {        \
    init_simd();                                                                                               \
    HWY_DYNAMIC_DISPATCH(decay_band_grads_##sfx)(dP, Gm, A, dPG, colsum, dgam, n);                             \
  }                                                                                                            \
  void delta_a0_grads(const T* dM, const T* Gm, const T* A, const T* bt, T* Z, T* B, T* dbt, i64 L, i64 ld) {  \
    init_simd();                                                                                               \
    HWY_DYNAMIC_DISPATCH(delta_a0_grads_##sfx)(dM, Gm, A, bt, Z, B, dbt, L, ld);                               \
  }                                                                                                            \
  void lower_row_minus_col_sums(const T* Z, T* dgam, i64 L, i64 ld) {                                          \
    init_simd();                                                                                               \
    HWY_DYNAMIC_DISPATCH(lower_row_minus_col_sums_##sfx)(Z, dgam, L, ld);                                      \
  }                                                                                                            \
  void state_transpose_products(const T* S, i64 K, i64 V, const T* x, const T* y, T* Sx, T* Sy) {              \
    init_simd();                                                                                               \
    HWY_DYNAMIC_DISPATCH(state_transpose_products_##sfx)(S, K, V, x, y, Sx, Sy);                               \
  }                                                                                                            \
  void state_decay_rank1(T* S, i64 K, i64 V, T a, const T* x, const T* u, T qs, const T* q, T* o) {            \
    init_simd();                                                                                               \
    HWY_DYNAMIC_DISPATCH(state_decay_rank1_##sfx)(S, K, V, a, x, u, qs, q, o);                                 \
  }
HLM_SCAN_ROW_OPS(float, f32)
HLM_SCAN_ROW_OPS(double, f64)
#undef HLM_SCAN_ROW_OPS

}  // namespace hlm::ops
#endif  // HWY_ONCE
