// Dense ops (matmul, linear, embedding, rmsnorm, swiglu, rope, fused LM-head cross-entropy) against
// plain double references, plus central finite-difference gradient checks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/matmul.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

// Reference C = alpha op(A) op(B) + beta C in double, strided, row-major.
std::vector<double> ref_matmul(bool ta, bool tb, i64 M, i64 N, i64 K, double alpha, const std::vector<float>& A,
                               i64 lda, const std::vector<float>& B, i64 ldb, double beta,
                               const std::vector<float>& C, i64 ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (i64 i = 0; i < M; ++i)
    for (i64 j = 0; j < N; ++j) {
      double s = 0;
      for (i64 k = 0; k < K; ++k) {
        double a = ta ? A[k * lda + i] : A[i * lda + k];
        double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
      }
      out[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * C[i * ldc + j]);
    }
  return out;
}

}  // namespace

TEST(Matmul, AllTransposeCombinationsWithStridesMatchDoubleReference) {
  const i64 M = 37, N = 45, K = 29;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.f, 0.5f}) {
        // Stored shapes: A is [M,K] or [K,M]; B is [K,N] or [N,K]; padded row strides.
        i64 a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
        i64 lda = a_cols + 3, ldb = b_cols + 5, ldc = N + 7;
        auto A = randn(a_rows * lda, 1 + ta);
        auto B = randn(b_rows * ldb, 3 + tb);
        auto C = beta == 0.f ? nan_vec(M * ldc) : randn(M * ldc, 9);
        // Padding of C must be left untouched.
        for (i64 i = 0; i < M; ++i)
          for (i64 j = N; j < ldc; ++j) C[i * ldc + j] = 123.f;
        auto want = ref_matmul(ta, tb, M, N, K, 0.75, A, lda, B, ldb, beta, C, ldc);
        ops::matmul(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        EXPECT_TRUE(close_rel(C, want, 1e-6, "matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb)));
        for (i64 i = 0; i < M; ++i)
          for (i64 j = N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], 123.f);
      }
}

TEST(Matmul, BadStridesAndZeroKThrowOrScale) {
  std::vector<float> A(16, 1.f), B(16, 1.f), C(16, 2.f);
  EXPECT_THROW(ops::matmul(false, false, 4, 4, 4, 1.f, A.data(), 3, B.data(), 4, 0.f, C.data(), 4), Error);
  ops::matmul(false, false, 4, 4, 0, 1.f, A.data(), 1, B.data(), 4, 0.5f, C.data(), 4);
  for (float c : C) EXPECT_EQ(c, 1.f);
}

TEST(Linear, ForwardAndBackwardMatchReferenceAndAccumulate) {
  const i64 N = 37, in = 45, out = 23;
  auto x = randn(N * in, 11), W = randn(out * in, 12), dy = randn(N * out, 13);
  auto y = nan_vec(N * out);
  ops::linear_forward(x.data(), W.data(), y.data(), N, in, out);
  std::vector<double> yref(N * out, 0), dxref(N * in, 0), dWref(out * in, 0);
  for (i64 n = 0; n < N; ++n)
    for (i64 o = 0; o < out; ++o) {
      double s = 0;
      for (i64 i = 0; i < in; ++i) s += double(x[n * in + i]) * W[o * in + i];
      yref[n * out + o] = s;
      for (i64 i = 0; i < in; ++i) {
        dxref[n * in + i] += double(dy[n * out + o]) * W[o * in + i];
        dWref[o * in + i] += double(dy[n * out + o]) * x[n * in + i];
      }
    }
  EXPECT_TRUE(close_rel(y, yref, 1e-6, "linear y"));

  auto dx = nan_vec(N * in);
  auto dW0 = randn(out * in, 14);
  auto dW = dW0;
  ops::linear_backward(x.data(), W.data(), dy.data(), dx.data(), dW.data(), N, in, out);
  EXPECT_TRUE(close_rel(dx, dxref, 1e-6, "linear dx"));
  std::vector<double> dWwant(out * in);
  for (i64 i = 0; i < out * in; ++i) dWwant[i] = dW0[i] + dWref[i];
  EXPECT_TRUE(close_rel(dW, dWwant, 1e-6, "linear dW accumulates"));

  // accumulate_dx adds to the existing dx; dx == nullptr skips it.
  auto dx2 = dx;
  ops::linear_backward(x.data(), W.data(), dy.data(), dx2.data(), nullptr, N, in, out, true);
  std::vector<double> dx2want(N * in);
  for (i64 i = 0; i < N * in; ++i) dx2want[i] = 2 * dxref[i];
  EXPECT_TRUE(close_rel(dx2, dx2want, 1e-6, "linear accumulate_dx"));
  auto dW2 = dW0;
  ops::linear_backward(x.data(), W.data(), dy.data(), nullptr, dW2.data(), N, in, out);
  EXPECT_TRUE(close_rel(dW2, dWwant, 1e-6, "linear dx=nullptr"));
}
