// The scans' dispatched vector pieces (ops/scan_simd.h) against plain double references: the vector exp against
// std::exp, and the forward substitution T = (I + M)^-1 against the same recurrence in double. The ctest entry
// simd_fallback_kernels runs them again on the portable target.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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
