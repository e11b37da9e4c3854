// The scans' dispatched vector pieces (ops/scan_simd.h) against plain double references: the vector exp against
// std::exp, the forward substitution T = (I + M)^-1 against the same recurrence in double, and the row, band and
// token-step state operations (float and double) against plain double loops. The ctest entry
// simd_fallback_kernels runs them again on the portable target.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/rng.h"
#include "ops/scan_simd.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::ops;
using namespace hlm::testing;

TEST(ScanSimd, ExpMatchesStdExp) {
  Rng r(3);
  for (i64 n : {0, 1, 7, 8, 9, 33, 100}) {
    std::vector<float> x(n);
    for (auto& v : x) v = static_cast<float>(r.uniform(-90, 10));
    if (n > 2) x[1] = -std::numeric_limits<float>::infinity(), x[2] = -87.5f;
    std::vector<float> y = x;
    y.push_back(123.f);  // past the end: left alone
    exp_inplace_simd(y.data(), n);
    EXPECT_EQ(y[n], 123.f);
    for (i64 i = 0; i < n; ++i) {
      if (x[i] < -87.3f) {
        EXPECT_EQ(y[i], 0.f) << "x = " << x[i];
        continue;
      }
      const double want = std::exp(static_cast<double>(x[i]));
      // ~2 ulp documented (ops/simd_math-inl.h); 4 ulp = 2^-21 relative bounds it.
      EXPECT_NEAR(y[i], want, want * 0x1p-21) << "x = " << x[i] << " n = " << n;
    }
  }
}

// T_ij = -sum_{m=j}^{i-1} beta_i A_im Gamma_im T_mj (j < i), T_ii = 1, 0 right of the diagonal.
std::vector<double> unit_lower_reference(const std::vector<double>& A, const std::vector<double>& G,
                                         const std::vector<double>& beta, i64 L, i64 C) {
  std::vector<double> T(L * C, 0.0);
  for (i64 i = 0; i < L; ++i) {
    for (i64 j = 0; j < i; ++j) {
      double s = 0;
      for (i64 m = j; m < i; ++m) s += beta[i] * A[i * C + m] * G[i * C + m] * T[m * C + j];
      T[i * C + j] = -s;
    }
    T[i * C + i] = 1;
  }
  return T;
}

TEST(ScanSimd, UnitLowerInverseMatchesPlainForwardSubstitution) {
  for (i64 L : {1, 5, 16, 17, 40, 64}) {
    SCOPED_TRACE(::testing::Message() << "L = " << L);
    const i64 C = (L + 15) / 16 * 16;
    Rng r(L);
    std::vector<double> A(L * C, 0.0), G(L * C, 0.0), beta(L);
    for (i64 i = 0; i < L; ++i) {
      beta[i] = r.uniform(0, 1);
      for (i64 m = 0; m < i; ++m) A[i * C + m] = 0.3 * r.normal(), G[i * C + m] = std::exp(-r.uniform(0, 2));
    }
    const auto want = unit_lower_reference(A, G, beta, L, C);
    std::vector<double> Td(L * C, std::nan(""));
    unit_lower_inverse(A.data(), G.data(), beta.data(), Td.data(), L, C);
    EXPECT_TRUE(close_rel(Td, want, 1e-13, "double T"));
    std::vector<float> Af(A.begin(), A.end()), Gf(G.begin(), G.end()), bf(beta.begin(), beta.end());
    std::vector<float> Tf = nan_vec(L * C);
    unit_lower_inverse(Af.data(), Gf.data(), bf.data(), Tf.data(), L, C);
    // Each entry: a sum over up to L terms, through a chain of up to L earlier rows.
    EXPECT_TRUE(close_rel(Tf, want, fp32_tol(fp32_depth({double(L), double(L)})), "float T"));
    for (i64 i = 0; i < L; ++i) {
      EXPECT_EQ(Tf[i * C + i], 1.f);
      for (i64 j = i + 1; j < C; ++j) ASSERT_EQ(Tf[i * C + j], 0.f) << "T[" << i << ", " << j << "]";
    }
  }
}

// ---- the row operations of the chunked scans, float and double, against plain double loops ----------------
// Sizes cover whole vectors and masked tails (1, 7, 17, 40 columns), row strides wider than the rows (the padding
// between rows must stay untouched), and in-place use where the header allows it.

namespace {

template <typename T>
std::vector<T> uniform_vec(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(r.uniform(-1, 1));
  return v;
}

template <typename T>
double row_op_tol(double depth) {
  return std::is_same_v<T, float> ? fp32_tol(depth) : 64 * 0x1p-53 * std::sqrt(depth);
}

template <typename T>
void check_row_ops(i64 m, i64 n) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, float> ? "float" : "double") << " m = " << m
                                    << " n = " << n);
  const i64 ld = n + 3;  // padding between rows
  const T pad = T(7);
  const auto x = uniform_vec<T>(m * ld, 1 + m), s = uniform_vec<T>(m, 2 + n);
  const auto y0 = uniform_vec<T>(m * ld, 3 + m * n);
  auto dd = [](const std::vector<T>& v) { return std::vector<double>(v.begin(), v.end()); };
  // axpy over the whole buffer
  {
    std::vector<T> y = y0;
    y.push_back(pad);
    axpy(T(0.75), x.data(), y.data(), m * ld);
    std::vector<double> want = dd(y0);
    for (i64 i = 0; i < m * ld; ++i) want[i] += 0.75 * double(x[i]);
    EXPECT_EQ(y.back(), pad);
    y.pop_back();
    EXPECT_TRUE(close_rel(dd(y), want, row_op_tol<T>(2), "axpy"));
    std::vector<T> z = y0;
    z.push_back(pad);
    mul_inplace(z.data(), x.data(), m * ld);
    EXPECT_EQ(z.back(), pad);
    z.pop_back();
    for (i64 i = 0; i < m * ld; ++i) want[i] = double(y0[i]) * double(x[i]);
    EXPECT_TRUE(close_rel(dd(z), want, row_op_tol<T>(1), "mul_inplace"));
  }
  // scale_rows (with and without per-row scales, and in place) and axpy_rows, on strided rows
  for (int variant = 0; variant < 4; ++variant) {
    std::vector<T> dst(m * ld, pad);
    std::vector<double> want(m * ld, double(pad));
    if (variant == 0) scale_rows(T(0.5), s.data(), x.data(), ld, dst.data(), ld, m, n);
    if (variant == 1) scale_rows(T(0.5), static_cast<const T*>(nullptr), x.data(), ld, dst.data(), ld, m, n);
    if (variant == 2) {
      dst = x;
      scale_rows(T(1), s.data(), dst.data(), ld, dst.data(), ld, m, n);
      want = dd(x);
    }
    if (variant == 3) {
      dst = y0;
      axpy_rows(s.data(), x.data(), ld, dst.data(), ld, m, n);
      want = dd(y0);
    }
    for (i64 r = 0; r < m; ++r)
      for (i64 j = 0; j < n; ++j) {
        const double sc = variant == 0 ? 0.5 * double(s[r]) : variant == 1 ? 0.5 : double(s[r]);
        const double v = double(x[r * ld + j]) * sc;
        want[r * ld + j] = variant == 3 ? want[r * ld + j] + v : v;
      }
    const std::string what = "scale_rows / axpy_rows variant " + std::to_string(variant);
    EXPECT_TRUE(close_rel(dd(dst), want, row_op_tol<T>(2), what));
    for (i64 r = 0; r < m; ++r)
      for (i64 j = n; j < ld; ++j) ASSERT_EQ(double(dst[r * ld + j]), want[r * ld + j]) << "padding " << r << ", " << j;
  }
}

// The band kernels on [L, L] blocks with row stride ld.
template <typename T>
void check_band_ops(i64 L) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, float> ? "float" : "double") << " L = " << L);
  const i64 ld = L + 5;
  const auto a = uniform_vec<T>(L * ld, 10 + L), b = uniform_vec<T>(L * ld, 11 + L), c = uniform_vec<T>(L * ld, 12);
  const auto bt = uniform_vec<T>(L, 13), z0 = uniform_vec<T>(L * ld, 14);
  auto dd = [](const std::vector<T>& v) { return std::vector<double>(v.begin(), v.end()); };
  // lower_product, out of place and in place
  for (bool inplace : {false, true}) {
    std::vector<T> out = inplace ? a : std::vector<T>(L * ld, T(7));
    lower_product(inplace ? out.data() : a.data(), b.data(), out.data(), L, ld);
    std::vector<double> want = dd(inplace ? a : std::vector<T>(L * ld, T(7)));
    for (i64 i = 0; i < L; ++i)
      for (i64 j = 0; j < L; ++j) want[i * ld + j] = j <= i ? double(a[i * ld + j]) * double(b[i * ld + j]) : 0.0;
    EXPECT_TRUE(close_rel(dd(out), want, row_op_tol<T>(1), inplace ? "lower_product in place" : "lower_product"));
    for (i64 i = 0; i < L; ++i)
      for (i64 j = i + 1; j < ld; ++j) ASSERT_EQ(double(out[i * ld + j]), want[i * ld + j]) << i << ", " << j;
  }
  // decay_band_grads: rows of n = L with no padding (the scan's blocks are [n, n])
  {
    std::vector<T> dPG = z0, cs(L, T(9));
    std::vector<double> dgam(L, 0.5), want_dpg = dd(z0), want_dgam(L, 0.5), cs_ref(L, 0.0);
    decay_band_grads(a.data(), b.data(), c.data(), dPG.data(), cs.data(), dgam.data(), L);
    for (i64 i = 0; i < L; ++i) {
      double rs = 0;
      for (i64 j = 0; j < i; ++j) {
        const double x = double(a[i * L + j]) * double(b[i * L + j]);
        want_dpg[i * L + j] += x;
        rs += x * double(c[i * L + j]);
        cs_ref[j] += x * double(c[i * L + j]);
      }
      want_dpg[i * L + i] += double(a[i * L + i]);
      want_dgam[i] += rs;
    }
    for (i64 i = 0; i < L; ++i) want_dgam[i] -= cs_ref[i];
    EXPECT_TRUE(close_rel(dd(dPG), want_dpg, row_op_tol<T>(2), "decay_band_grads dPG"));
    EXPECT_TRUE(close_rel(dgam, want_dgam, row_op_tol<T>(2 * L + 2), "decay_band_grads dgam"));
    for (i64 i = L * L; i < L * ld; ++i) ASSERT_EQ(dPG[i], z0[i]) << "past the block at " << i;
  }
  // delta_a0_grads and lower_row_minus_col_sums
  {
    std::vector<T> Z = z0, B(L * ld, T(7)), dbt(L, T(9));
    delta_a0_grads(a.data(), b.data(), c.data(), bt.data(), Z.data(), B.data(), dbt.data(), L, ld);
    std::vector<double> wz = dd(z0), wb(L * ld, 7.0), wdbt(L, 0.0);
    for (i64 i = 0; i < L; ++i) {
      for (i64 j = 0; j < i; ++j) {
        const double da0 = double(a[i * ld + j]) * double(b[i * ld + j]);
        wdbt[i] += da0 * double(c[i * ld + j]);
        wz[i * ld + j] += da0 * double(bt[i]) * double(c[i * ld + j]);
        wb[i * ld + j] = double(bt[i]) * da0;
      }
      wb[i * ld + i] = 0;
    }
    EXPECT_TRUE(close_rel(dd(Z), wz, row_op_tol<T>(3), "delta_a0_grads Z"));
    EXPECT_TRUE(close_rel(dd(B), wb, row_op_tol<T>(2), "delta_a0_grads B"));
    if (L > 1) {
      EXPECT_TRUE(close_rel(dd(dbt), wdbt, row_op_tol<T>(L + 1), "delta_a0_grads dbt"));
    }
    EXPECT_EQ(double(dbt[0]), 0.0);
    for (i64 i = 0; i < L; ++i)
      for (i64 j = i + 1; j < ld; ++j) ASSERT_EQ(B[i * ld + j], T(7)) << "B right of the diagonal " << i << ", " << j;
    std::vector<T> dgam = bt;
    lower_row_minus_col_sums(a.data(), dgam.data(), L, ld);
    std::vector<double> wg = dd(bt);
    for (i64 i = 0; i < L; ++i)
      for (i64 j = 0; j < i; ++j) wg[j] -= double(a[i * ld + j]), wg[i] += double(a[i * ld + j]);
    EXPECT_TRUE(close_rel(dd(dgam), wg, row_op_tol<T>(2 * L), "lower_row_minus_col_sums"));
  }
}

// Depth of K-term sums whose terms cancel (testing.h: kappa^2 times the length), kappa the ratio of the RMS of
// the sums of |terms| to the RMS of the sums: a rank-one state's read-out is one dot product in every column.
double cancelling_sums_depth(i64 K, const std::vector<double>& abs_sums, const std::vector<double>& sums) {
  double a = 0, s = 0;
  for (size_t j = 0; j < sums.size(); ++j) a += abs_sums[j] * abs_sums[j], s += sums[j] * sums[j];
  return double(K) * std::max(1.0, a / s);
}

// The recurrent token step's kernels on a state [K, V]: S^T x and S^T y in one pass, and a S + x u^T with the
// read-out qs S^T q of the updated state; a == 0 overwrites a state holding inf.
template <typename T>
void check_state_step_ops(i64 K, i64 V) {
  SCOPED_TRACE(::testing::Message() << (std::is_same_v<T, float> ? "float" : "double") << " K = " << K
                                    << " V = " << V);
  const auto S0 = uniform_vec<T>(K * V, 20 + K * V), x = uniform_vec<T>(K, 21 + K), y = uniform_vec<T>(K, 22);
  const auto u = uniform_vec<T>(V, 23 + V);
  auto dd = [](const std::vector<T>& v) { return std::vector<double>(v.begin(), v.end()); };
  for (bool with_y : {true, false}) {
    std::vector<T> Sx(V + 1, T(7)), Sy(V + 1, T(7));
    state_transpose_products(S0.data(), K, V, x.data(), with_y ? y.data() : nullptr, Sx.data(), Sy.data());
    std::vector<double> wx(V, 0.0), wy(V, 0.0), ax(V, 0.0), ay(V, 0.0);
    for (i64 i = 0; i < K; ++i)
      for (i64 j = 0; j < V; ++j) {
        wx[j] += double(x[i]) * double(S0[i * V + j]);
        wy[j] += double(y[i]) * double(S0[i * V + j]);
        ax[j] += std::abs(double(x[i]) * double(S0[i * V + j]));
        ay[j] += std::abs(double(y[i]) * double(S0[i * V + j]));
      }
    EXPECT_EQ(Sx[V], T(7));
    EXPECT_EQ(Sy[V], T(7));
    Sx.pop_back(), Sy.pop_back();
    EXPECT_TRUE(close_rel(dd(Sx), wx, row_op_tol<T>(cancelling_sums_depth(K, ax, wx)), "S^T x"));
    if (with_y)
      EXPECT_TRUE(close_rel(dd(Sy), wy, row_op_tol<T>(cancelling_sums_depth(K, ay, wy)), "S^T y"));
    else
      EXPECT_EQ(Sy, std::vector<T>(V, T(7))) << "Sy written without y";
  }
  for (int variant = 0; variant < 3; ++variant) {  // decay only, decay and read-out, overwrite and read-out
    const T a = variant == 2 ? T(0) : T(0.875), qs = T(0.25);
    std::vector<T> S = S0, o(V + 1, T(7));
    if (variant == 2) S[0] = std::numeric_limits<T>::infinity();
    S.push_back(T(7));
    state_decay_rank1(S.data(), K, V, a, x.data(), u.data(), qs, variant ? y.data() : nullptr, o.data());
    EXPECT_EQ(S.back(), T(7));
    EXPECT_EQ(o.back(), T(7));
    S.pop_back(), o.pop_back();
    std::vector<double> wS(K * V), wo(V, 0.0), ao(V, 0.0);
    for (i64 i = 0; i < K; ++i)
      for (i64 j = 0; j < V; ++j) {
        wS[i * V + j] = double(a) * (variant == 2 ? 0.0 : double(S0[i * V + j])) + double(x[i]) * double(u[j]);
        wo[j] += double(qs) * double(y[i]) * wS[i * V + j];
        ao[j] += std::abs(double(qs) * double(y[i]) * wS[i * V + j]);
      }
    EXPECT_TRUE(close_rel(dd(S), wS, row_op_tol<T>(2), "a S + x u^T, variant " + std::to_string(variant)));
    if (variant)
      EXPECT_TRUE(close_rel(dd(o), wo, row_op_tol<T>(3 + cancelling_sums_depth(K, ao, wo)),
                            "qs S^T q, variant " + std::to_string(variant)));
    else
      EXPECT_EQ(o, std::vector<T>(V, T(7))) << "o written without q";
  }
}

}  // namespace

TEST(ScanSimd, RowOperationsMatchPlainLoops) {
  for (i64 m : {1, 3})
    for (i64 n : {1, 7, 16, 17, 40}) {
      check_row_ops<float>(m, n);
      check_row_ops<double>(m, n);
    }
}

TEST(ScanSimd, BandOperationsMatchPlainLoops) {
  for (i64 L : {1, 2, 9, 16, 33, 64}) {
    check_band_ops<float>(L);
    check_band_ops<double>(L);
  }
}

TEST(ScanSimd, StateStepOperationsMatchPlainLoops) {
  for (i64 K : {1, 5, 32})
    for (i64 V : {1, 7, 16, 17, 40, 64, 130}) {
      check_state_step_ops<float>(K, V);
      check_state_step_ops<double>(K, V);
    }
}
