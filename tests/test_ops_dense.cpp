// Dense ops (matmul, linear, embedding, rmsnorm, swiglu, rope, fused LM-head cross-entropy) against
// plain double references, plus central finite-difference gradient checks.
#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.h>

#include <omp.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/error.h"
#include "ops/add.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/gated_unit.h"
#include "ops/matmul.h"
#include "ops/precision.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/small_gemm.h"
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

// The forward products with a narrow output go to oneDNN's matmul primitive instead of dnnl_sgemm (ops/matmul.h):
// which shapes, and that path against the double reference with row strides, alpha, beta 0 over NaN and beta 0.5.
// Bound: a dot product of K terms plus the alpha and beta roundings (docs/testing.md).
TEST(Matmul, NarrowForwardProductsOnThePrimitiveMatchDoubleReference) {
  // Only where oneDNN runs AVX-512, and not under HLM_SGEMM_ONLY=1.
  const char* only = std::getenv("HLM_SGEMM_ONLY");
  const unsigned isa = dnnl_get_effective_cpu_isa(), avx512 = dnnl_cpu_isa_avx512_core;
  const bool on = (isa & avx512) == avx512 && !(only && std::string(only) == "1");
  EXPECT_EQ(ops::narrow_forward_product(false, true, 8192, 256, 768), on);  // MLP down projection
  EXPECT_EQ(ops::narrow_forward_product(false, true, 8192, 256, 256), on);  // attention output
  EXPECT_FALSE(ops::narrow_forward_product(false, true, 8192, 1536, 256));  // wide: dnnl_sgemm
  EXPECT_FALSE(ops::narrow_forward_product(false, false, 8192, 256, 768));  // backward layouts: dnnl_sgemm
  EXPECT_FALSE(ops::narrow_forward_product(true, false, 256, 768, 8192));
  EXPECT_FALSE(ops::narrow_forward_product(false, true, 256, 256, 768));  // few rows (the LM head's tiles)
  const i64 M = 1100, N = 40, K = 300;
  ASSERT_EQ(ops::narrow_forward_product(false, true, M, N, K), on);
  const i64 lda = K + 3, ldb = K + 5, ldc = N + 7;
  const auto A = randn(M * lda, 21), B = randn(N * ldb, 22);
  for (float beta : {0.f, 0.5f}) {
    auto C = beta == 0.f ? nan_vec(M * ldc) : randn(M * ldc, 23);
    for (i64 i = 0; i < M; ++i)
      for (i64 j = N; j < ldc; ++j) C[i * ldc + j] = 123.f;
    const auto want = ref_matmul(false, true, M, N, K, 0.75, A, lda, B, ldb, beta, C, ldc);
    ops::matmul(false, true, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
    EXPECT_TRUE(close_rel(C, want, fp32_tol(fp32_depth({double(K), 2})), "beta=" + std::to_string(beta)));
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

// Row strides of y (forward) and dy (backward): the same bits as dense rows, padding left alone in y and never read
// in dy (NaN there), in fp32 and, where oneDNN has it, bf16; at a size on dnnl_sgemm and at one on the narrow-forward
// primitive (ops::narrow_forward_product, on AVX-512 CPUs).
TEST(Linear, RowStridesOfYAndDyGiveTheDenseBits) {
  std::vector<ops::Precision> precisions = {ops::Precision::fp32};
  if (ops::bf16_matmul_available()) precisions.push_back(ops::Precision::bf16);
  for (const ops::Precision prec : precisions)
    for (auto [N, in, out] : {std::array<i64, 3>{37, 45, 23}, std::array<i64, 3>{1100, 300, 40}}) {
      const ops::PrecisionScope scope(prec, /*allow_emulated=*/true);
      const std::string what = std::string(prec == ops::Precision::bf16 ? "bf16" : "fp32") + " N=" + std::to_string(N);
      const i64 ld = out + 9;
      const auto x = randn(N * in, 31), W = randn(out * in, 32), dy = randn(N * out, 33);
      std::vector<float> y(N * out), ys(N * ld, 123.f), dys = nan_vec(N * ld);
      ops::linear_forward(x.data(), W.data(), y.data(), N, in, out);
      ops::linear_forward(x.data(), W.data(), ys.data(), N, in, out, ld);
      for (i64 n = 0; n < N; ++n) {
        for (i64 o = 0; o < out; ++o) ASSERT_EQ(float_bits(ys[n * ld + o]), float_bits(y[n * out + o])) << what;
        for (i64 o = out; o < ld; ++o) ASSERT_EQ(ys[n * ld + o], 123.f) << what;
        std::copy(dy.begin() + n * out, dy.begin() + (n + 1) * out, dys.begin() + n * ld);
      }
      std::vector<float> dx(N * in), dxs(N * in), dW(out * in, 0.f), dWs(out * in, 0.f);
      ops::linear_backward(x.data(), W.data(), dy.data(), dx.data(), dW.data(), N, in, out);
      ops::linear_backward(x.data(), W.data(), dys.data(), dxs.data(), dWs.data(), N, in, out, false, ld);
      for (i64 i = 0; i < N * in; ++i) ASSERT_EQ(float_bits(dxs[i]), float_bits(dx[i])) << what << " dx " << i;
      for (i64 i = 0; i < out * in; ++i) ASSERT_EQ(float_bits(dWs[i]), float_bits(dW[i])) << what << " dW " << i;
    }
}

// The scans' small products on the micro-kernel (ops/small_gemm.h): every layout, row strides, the alpha and beta the
// scans use (1 with 0 or 1, a scale with 0 or 1) and a general pair, and sizes that leave partial vectors and
// partial 4-row blocks. Bound: a dot product of K terms plus the alpha and beta roundings (docs/testing.md).
TEST(SmallGemm, EveryLayoutSizeAndScalingMatchesTheDoubleReference) {
  const std::vector<std::array<i64, 3>> shapes = {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {64, 64, 64}, {64, 64, 32},
                                                  {70, 81, 65}, {4, 128, 128}, {128, 3, 100}};
  const std::vector<std::pair<float, float>> scalings = {{1.f, 0.f}, {1.f, 1.f}, {0.125f, 0.f}, {0.125f, 1.f},
                                                         {0.75f, 0.5f}};
  for (auto [M, N, K] : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (auto [alpha, beta] : scalings) {
          const i64 a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
          const i64 lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 5;
          auto A = randn(a_rows * lda, 1 + ta);
          auto B = randn(b_rows * ldb, 3 + tb);
          auto C = beta == 0.f ? nan_vec(M * ldc) : randn(M * ldc, 9);
          for (i64 i = 0; i < M; ++i)
            for (i64 j = N; j < ldc; ++j) C[i * ldc + j] = 123.f;  // padding must stay
          auto want = ref_matmul(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
          ops::small_gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          const std::string what = "small_gemm " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                   std::to_string(K) + " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                   " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta);
          EXPECT_TRUE(close_rel(C, want, fp32_tol(fp32_depth({double(K), 2})), what));
          for (i64 i = 0; i < M; ++i)
            for (i64 j = N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], 123.f) << what;
        }
}

TEST(SmallGemm, RefusesLargeSidesAndBadStridesAndScalesForZeroK) {
  std::vector<float> A(16, 1.f), B(16, 1.f), C(16, 2.f);
  EXPECT_THROW(ops::small_gemm(false, false, 4, 4, 4, 1.f, A.data(), 3, B.data(), 4, 0.f, C.data(), 4), Error);
  EXPECT_FALSE(ops::small_gemm_fits(ops::kSmallGemmMax + 1, 4, 4));
  std::vector<float> big(static_cast<size_t>((ops::kSmallGemmMax + 1) * 4), 1.f);
  EXPECT_THROW(ops::small_gemm(false, false, ops::kSmallGemmMax + 1, 4, 4, 1.f, big.data(), 4, B.data(), 4, 0.f,
                               big.data(), 4),
               Error);
  ops::small_gemm(false, false, 4, 4, 0, 1.f, A.data(), 1, B.data(), 4, 0.5f, C.data(), 4);
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

// ---------------------------------------------------------------------------------------------------
namespace {

// Runs a body with a given OpenMP thread count and restores the previous one.
template <typename Fn>
void with_threads(int nt, Fn&& fn) {
  const int old = omp_get_max_threads();
  omp_set_num_threads(nt);
  fn();
  omp_set_num_threads(old);
}

std::vector<int32_t> rand_tokens(i64 n, i64 V, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(r.below(V));
  return t;
}

double dot(const std::vector<double>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

// ----------------------------------------- embedding -----------------------------------------------
TEST(Embedding, ForwardGathersRowsAndRejectsOutOfRangeTokens) {
  const i64 N = 37, D = 45, V = 103;
  auto table = randn(V * D, 21);
  auto tok = rand_tokens(N, V, 22);
  tok[0] = 0, tok[1] = V - 1;
  auto out = nan_vec(N * D);
  ops::embedding_forward(tok.data(), table.data(), out.data(), N, D, V);
  for (i64 n = 0; n < N; ++n)
    for (i64 d = 0; d < D; ++d) ASSERT_EQ(out[n * D + d], table[tok[n] * D + d]) << n << "," << d;

  for (int32_t bad : {static_cast<int32_t>(V), -1}) {
    auto t2 = tok;
    t2[5] = bad;
    EXPECT_THROW(ops::embedding_forward(t2.data(), table.data(), out.data(), N, D, V), Error);
    std::vector<float> dt(V * D, 0.f);
    EXPECT_THROW(ops::embedding_backward(t2.data(), out.data(), dt.data(), N, D, V), Error);
  }
}

TEST(Embedding, BackwardAccumulatesScatterAndMatchesFiniteDifferences) {
  const i64 N = 37, D = 45, V = 11;  // small V: many repeated tokens
  auto table = randn(V * D, 23);
  auto tok = rand_tokens(N, V, 24);
  auto dout = randn(N * D, 25);
  auto dt0 = randn(V * D, 26);
  auto dt = dt0;
  ops::embedding_backward(tok.data(), dout.data(), dt.data(), N, D, V);
  // loss = <G, table[tokens]> in double; its gradient w.r.t. table is the scatter of G (central FD).
  std::vector<double> table_d = to_double(table), G = to_double(dout);
  auto loss = [&]() {
    double s = 0;
    for (i64 n = 0; n < N; ++n)
      for (i64 d = 0; d < D; ++d) s += G[n * D + d] * table_d[tok[n] * D + d];
    return s;
  };
  std::vector<double> want(V * D);
  for (size_t i = 0; i < want.size(); ++i) want[i] = dt0[i] + fd_grad(table_d, i, loss, 1e-3);
  EXPECT_TRUE(close_rel(dt, want, 1e-6, "embedding dtable"));

  // Bit-identical whatever the thread count (rows summed in token order).
  std::vector<float> a(V * D, 0.f), b(V * D, 0.f);
  with_threads(1, [&] { ops::embedding_backward(tok.data(), dout.data(), a.data(), N, D, V); });
  with_threads(3, [&] { ops::embedding_backward(tok.data(), dout.data(), b.data(), N, D, V); });
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// ------------------------------------------ rmsnorm ------------------------------------------------
namespace {
std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>* w, i64 N, i64 D, double eps,
                                std::vector<double>* rstd = nullptr) {
  std::vector<double> y(N * D);
  if (rstd) rstd->resize(N);
  for (i64 n = 0; n < N; ++n) {
    double ss = 0;
    for (i64 d = 0; d < D; ++d) ss += x[n * D + d] * x[n * D + d];
    double r = 1.0 / std::sqrt(ss / D + eps);
    if (rstd) (*rstd)[n] = r;
    for (i64 d = 0; d < D; ++d) y[n * D + d] = x[n * D + d] * r * (w ? (*w)[d] : 1.0);
  }
  return y;
}
}  // namespace

TEST(RMSNorm, ForwardAndGradientsMatchDoubleReferenceWithAndWithoutWeight) {
  const i64 N = 37, D = 45;
  const float eps = 1e-5f;
  auto x = randn(N * D, 31);
  auto w = randn(D, 32, 0.5);
  for (auto& v : w) v += 1.f;
  auto dy = randn(N * D, 33);
  for (bool weighted : {true, false}) {
    SCOPED_TRACE(weighted ? "weighted" : "weightless");
    std::vector<double> xd = to_double(x), wd = to_double(w), G = to_double(dy);
    std::vector<double>* wp = weighted ? &wd : nullptr;
    std::vector<double> rstd_ref;
    auto yref = ref_rmsnorm(xd, wp, N, D, eps, &rstd_ref);
    auto y = nan_vec(N * D), rstd = nan_vec(N);
    ops::rmsnorm_forward(x.data(), weighted ? w.data() : nullptr, y.data(), rstd.data(), N, D, eps);
    EXPECT_TRUE(close_rel(y, yref, 1e-6, "rmsnorm y"));
    EXPECT_TRUE(close_rel(rstd, rstd_ref, 1e-6, "rmsnorm rstd"));

    auto dx = nan_vec(N * D);
    auto dw0 = randn(D, 34);
    auto dw = dw0;
    ops::rmsnorm_backward(x.data(), weighted ? w.data() : nullptr, rstd.data(), dy.data(), dx.data(),
                          weighted ? dw.data() : nullptr, N, D);
    auto loss = [&]() { return dot(ref_rmsnorm(xd, wp, N, D, eps), dy); };
    std::vector<double> dx_fd(N * D);
    for (i64 i = 0; i < N * D; ++i) dx_fd[i] = fd_grad(xd, i, loss, 1e-5);
    EXPECT_TRUE(close_rel(dx, dx_fd, 1e-5, "rmsnorm dx"));
    if (weighted) {
      std::vector<double> dw_fd(D);
      for (i64 d = 0; d < D; ++d) dw_fd[d] = dw0[d] + fd_grad(wd, d, loss, 1e-5);
      EXPECT_TRUE(close_rel(dw, dw_fd, 1e-5, "rmsnorm dw (accumulated)"));
    }
  }
}

// The model's fused residual forms: the add folded into the norm's pass (forward), the gradient added onto the
// residual stream's (backward). Each must give the bits of the two separate steps it replaces.
TEST(RMSNorm, ResidualFormsEqualTheSeparateAddBitForBit) {
  for (i64 D : {45, 256}) {  // 45: a partial vector at each row's end on every target
    SCOPED_TRACE(D);
    const i64 N = 37;
    const float eps = 1e-5f;
    auto h = randn(N * D, 41), r = randn(N * D, 42), w = randn(D, 43, 0.5), dy = randn(N * D, 44);
    auto sum = h;
    for (i64 i = 0; i < N * D; ++i) sum[i] += r[i];
    auto y_ref = nan_vec(N * D), rstd_ref = nan_vec(N);
    ops::rmsnorm_forward(sum.data(), w.data(), y_ref.data(), rstd_ref.data(), N, D, eps);
    auto y = nan_vec(N * D), rstd = nan_vec(N);
    ops::residual_rmsnorm_forward(h.data(), r.data(), w.data(), y.data(), rstd.data(), N, D, eps);
    EXPECT_EQ(h, sum);  // h += r in place
    EXPECT_EQ(y, y_ref);
    EXPECT_EQ(rstd, rstd_ref);

    auto g = nan_vec(N * D), dw_ref = randn(D, 45);
    auto dw = dw_ref;
    ops::rmsnorm_backward(sum.data(), w.data(), rstd.data(), dy.data(), g.data(), dw_ref.data(), N, D);
    auto dres = randn(N * D, 46);
    auto dres_ref = dres;
    for (i64 i = 0; i < N * D; ++i) dres_ref[i] += g[i];
    ops::rmsnorm_backward(sum.data(), w.data(), rstd.data(), dy.data(), dres.data(), dw.data(), N, D,
                          /*accumulate_dx=*/true);
    EXPECT_EQ(dres, dres_ref);
    EXPECT_EQ(dw, dw_ref);
  }
  std::vector<float> x(8, 1.f), rs(1, 1.f);
  EXPECT_THROW(ops::rmsnorm_backward(x.data(), nullptr, rs.data(), x.data(), x.data(), nullptr, 1, 8, true), Error);
}

TEST(AddInto, AddsEveryElementAcrossThreads) {
  for (i64 n : {0, 7, 100000}) {  // 100000: split across threads where there are several
    auto dst = randn(n, 51), src = randn(n, 52);
    auto want = dst;
    for (i64 i = 0; i < n; ++i) want[i] += src[i];
    ops::add_into(dst.data(), src.data(), n);
    EXPECT_EQ(dst, want) << n;
  }
}

// ------------------------------------------ swiglu -------------------------------------------------
namespace {
std::vector<double> ref_swiglu(const std::vector<double>& gu, i64 N, i64 F) {
  std::vector<double> h(N * F);
  for (i64 n = 0; n < N; ++n)
    for (i64 f = 0; f < F; ++f) {
      double g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
      h[n * F + f] = g / (1.0 + std::exp(-g)) * u;
    }
  return h;
}
}  // namespace

namespace {
// A gated unit's fp32 kernels (forward, backward) against its double reference: the product, d gate|up against
// central differences of the reference, the product again from the backward (into dh's buffer, then fully in
// place as training runs it: the same bits). Returns the forward's product.
using GatedForward = void (*)(const float*, float*, i64, i64);
using GatedBackward = void (*)(const float*, const float*, float*, i64, i64, float*);
using GatedReference = std::vector<double> (*)(const std::vector<double>&, i64, i64);
std::vector<float> expect_gated_unit_matches_reference(const std::string& name, GatedForward forward,
                                                       GatedBackward backward, GatedReference ref, uint64_t seed) {
  const i64 N = 37, F = 45;
  auto gu = randn(N * 2 * F, seed, 2.0);
  gu[0] = 30.f, gu[1] = -30.f, gu[2] = 95.f, gu[3] = -95.f;  // saturated gates stay finite and exact
  auto dh = randn(N * F, seed + 1);
  std::vector<double> gud = to_double(gu);
  auto h = nan_vec(N * F);
  forward(gu.data(), h.data(), N, F);
  EXPECT_TRUE(close_rel(h, ref(gud, N, F), 1e-6, name + " h"));

  auto dgu = nan_vec(N * 2 * F);
  backward(gu.data(), dh.data(), dgu.data(), N, F, nullptr);
  auto loss = [&]() { return dot(ref(gud, N, F), dh); };
  std::vector<double> fd(N * 2 * F);
  for (i64 i = 0; i < N * 2 * F; ++i) fd[i] = fd_grad(gud, i, loss, 1e-5);
  EXPECT_TRUE(close_rel(dgu, fd, 1e-5, name + " dgu"));
  for (float v : dgu) EXPECT_TRUE(std::isfinite(v)) << name;

  // The backward that also rewrites the product into dh's buffer (training's use): the same dgu, and h.
  auto dh2 = dh, dgu2 = nan_vec(N * 2 * F);
  backward(gu.data(), dh2.data(), dgu2.data(), N, F, dh2.data());
  EXPECT_EQ(dgu2, dgu) << name;
  EXPECT_TRUE(close_rel(dh2, ref(gud, N, F), 1e-6, name + " h from backward"));

  // Fully in place, as training runs it: d gate|up over gate|up, the product over dh. The same bits.
  auto gu3 = gu, dh3 = dh;
  backward(gu3.data(), dh3.data(), gu3.data(), N, F, dh3.data());
  EXPECT_EQ(gu3, dgu) << name;
  EXPECT_EQ(dh3, dh2) << name;
  return h;
}
}  // namespace

TEST(SwiGLU, ForwardAndGradientMatchDoubleReference) {
  expect_gated_unit_matches_reference("swiglu", ops::swiglu_forward, ops::swiglu_backward, ref_swiglu, 41);
}

// A bf16 step's SwiGLU reads gate|up in bf16 and writes its outputs rounded (ops::swiglu_*_bf16): bit for bit
// ops::to_bf16 of what the fp32 kernels give on the widened gate|up, ties, infinities, NaN, signed zero and
// subnormals included, with a row length that leaves a partial vector (37), and d gate|up written over dh's memory
// and over gate|up's. No bf16 matmul is involved: runs on every target (the SwiGLU suite also runs on the fallback
// and on arm64).
TEST(SwiGLU, Bf16KernelsAreTheFp32KernelsOnWidenedInputsRoundedBitForBit) {
  const i64 N = 9, F = 37;
  auto gu = randn(N * 2 * F, 21, 3.0);
  auto dh = randn(N * F, 22);
  Rng r(23);
  for (i64 i = 0; i < N * F; ++i) dh[i] *= static_cast<float>(std::exp(r.normal() * 8));  // a wide range of sizes
  // Row 0: gate 48 (silu(48) is 48 in fp32: sigmoid rounds to 1), so h = 48 up exactly; the ups (bf16 values) make
  // h a tie rounding up (48 x 1.0078125 = 48.375), a tie rounding down (48 x 1.0234375 = 49.125), a negative tie,
  // infinity, NaN, -0 and a subnormal (48 x the smallest bf16 subnormal).
  const float ups[] = {1.0078125f, 1.0234375f, -1.0078125f, bits_float(0x7f800000u), bits_float(0x7fc00000u), -0.f,
                       bits_float(0x00010000u)};
  const std::uint32_t h_bits[] = {0x42418000u, 0x42448000u, 0xc2418000u, 0x7f800000u, 0x7fc00000u, 0x80000000u};
  for (i64 f = 0; f < F; ++f) gu[f] = 48.f;
  for (size_t k = 0; k < std::size(ups); ++k) gu[F + k] = ups[k];
  const std::vector<ops::bf16> gub = bf16_rounded(gu);
  const std::vector<float> guw = widened(gub);  // gate|up as the bf16 kernels see it
  for (size_t k = 0; k < std::size(ups); ++k)
    ASSERT_EQ(float_bits(guw[F + k]), float_bits(ups[k])) << "not a bf16 value, lane " << k;
  std::vector<float> h32(N * F);
  ops::swiglu_forward(guw.data(), h32.data(), N, F);
  for (size_t k = 0; k < std::size(h_bits); ++k)
    ASSERT_EQ(float_bits(h32[k]), h_bits[k]) << "the fp32 kernel no longer gives the case the test means, lane " << k;
  ASSERT_EQ(std::fpclassify(h32[6]), FP_SUBNORMAL);
  std::vector<ops::bf16> hb(N * F, 0xdead);
  ops::swiglu_forward_bf16(gub.data(), hb.data(), N, F);
  EXPECT_EQ(hb, bf16_rounded(h32));
  EXPECT_EQ(hb[0], 0x4242);
  EXPECT_EQ(hb[1], 0x4244);
  EXPECT_EQ(hb[2], 0xc242);
  EXPECT_EQ(hb[3], 0x7f80);
  EXPECT_TRUE(std::isnan(ops::from_bf16(hb[4])));
  EXPECT_EQ(hb[5], 0x8000);

  std::vector<float> dgu32(N * 2 * F), p32(N * F);
  ops::swiglu_backward(guw.data(), dh.data(), dgu32.data(), N, F, p32.data());
  // Separate buffers.
  std::vector<ops::bf16> dgub(N * 2 * F, 0xdead), pb(N * F, 0xdead);
  ops::swiglu_backward_bf16(gub.data(), dh.data(), dgub.data(), N, F, pb.data());
  EXPECT_EQ(dgub, bf16_rounded(dgu32));
  EXPECT_EQ(pb, bf16_rounded(p32));
  EXPECT_EQ(pb, hb);  // the product again, from the backward's own pass
  // d gate|up over dh (as the model's MLP backward does), without the product.
  std::vector<float> dh_mem = dh;
  auto* over = reinterpret_cast<ops::bf16*>(dh_mem.data());
  ops::swiglu_backward_bf16(gub.data(), dh_mem.data(), over, N, F);
  EXPECT_EQ(std::vector<ops::bf16>(over, over + N * 2 * F), bf16_rounded(dgu32));
  // d gate|up over gate|up.
  std::vector<ops::bf16> gu_mem = gub;
  ops::swiglu_backward_bf16(gu_mem.data(), dh.data(), gu_mem.data(), N, F);
  EXPECT_EQ(gu_mem, bf16_rounded(dgu32));
}

// ------------------------------------------ geglu --------------------------------------------------
namespace {
// transformers' gelu_pytorch_tanh in double: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), times up.
std::vector<double> ref_geglu(const std::vector<double>& gu, i64 N, i64 F) {
  const double c = std::sqrt(2.0 / M_PI);
  std::vector<double> h(N * F);
  for (i64 n = 0; n < N; ++n)
    for (i64 f = 0; f < F; ++f) {
      double g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
      h[n * F + f] = 0.5 * g * (1.0 + std::tanh(c * (g + 0.044715 * g * g * g))) * u;
    }
  return h;
}
}  // namespace

TEST(GeGLU, ForwardAndGradientMatchDoubleReference) {
  const i64 F = 45;
  const std::vector<float> h =
      expect_gated_unit_matches_reference("geglu", ops::geglu_forward, ops::geglu_backward, ref_geglu, 43);
  const auto gu = randn(37 * 2 * F, 43, 2.0);  // the helper's gate|up (its saturated gates set over these)
  EXPECT_EQ(h[0], 30.f * gu[F]) << "gelu(30) rounds to 30 in fp32";
  EXPECT_LT(std::fabs(h[1]), 1e-30f) << "gelu(-30) is below 1e-30";
}

// The bf16 step's GeGLU: bit for bit ops::to_bf16 of the fp32 kernels on the widened gate|up (the rounding is the
// SwiGLU kernels' own, tested with its edge cases above), d gate|up also over dh's memory.
TEST(GeGLU, Bf16KernelsAreTheFp32KernelsOnWidenedInputsRounded) {
  const i64 N = 9, F = 37;
  const std::vector<ops::bf16> gub = bf16_rounded(randn(N * 2 * F, 24, 3.0));
  const std::vector<float> guw = widened(gub), dh = randn(N * F, 25);
  std::vector<float> h32(N * F), dgu32(N * 2 * F), p32(N * F);
  ops::geglu_forward(guw.data(), h32.data(), N, F);
  ops::geglu_backward(guw.data(), dh.data(), dgu32.data(), N, F, p32.data());
  std::vector<ops::bf16> hb(N * F, 0xdead), dgub(N * 2 * F, 0xdead), pb(N * F, 0xdead);
  ops::geglu_forward_bf16(gub.data(), hb.data(), N, F);
  ops::geglu_backward_bf16(gub.data(), dh.data(), dgub.data(), N, F, pb.data());
  EXPECT_EQ(hb, bf16_rounded(h32));
  EXPECT_EQ(dgub, bf16_rounded(dgu32));
  EXPECT_EQ(pb, hb);
  std::vector<float> dh_mem = dh;
  auto* over = reinterpret_cast<ops::bf16*>(dh_mem.data());
  ops::geglu_backward_bf16(gub.data(), dh_mem.data(), over, N, F);
  EXPECT_EQ(std::vector<ops::bf16>(over, over + N * 2 * F), bf16_rounded(dgu32));
}

// -------------------------------------------- rope -------------------------------------------------
namespace {
// Reference half-split rotation in double, angles p * theta^(-2m/hd).
void ref_rope(std::vector<double>& x, i64 B, i64 T, i64 H, i64 hd, i64 stride, const int32_t* pos, double theta) {
  for (i64 i = 0; i < B * T; ++i) {
    double p = pos ? pos[i] : i % T;
    for (i64 h = 0; h < H; ++h)
      for (i64 m = 0; m < hd / 2; ++m) {
        double a = p * std::pow(theta, -2.0 * m / hd);
        double& x1 = x[i * stride + h * hd + m];
        double& x2 = x[i * stride + h * hd + m + hd / 2];
        double u = x1, v = x2;
        x1 = u * std::cos(a) - v * std::sin(a);
        x2 = v * std::cos(a) + u * std::sin(a);
      }
  }
}
}  // namespace

TEST(RoPE, TableForwardBackwardMatchReferenceAndKeepPadding) {
  const i64 B = 2, T = 13, H = 3, hd = 10, stride = H * hd + 7, maxp = 5000;
  const double theta = 10000.0;
  ops::RopeTable tab(maxp, hd, theta);
  ASSERT_EQ(tab.cos.size(), size_t(maxp * hd / 2));
  for (i64 p : {i64{0}, i64{1}, i64{4999}})
    for (i64 m = 0; m < hd / 2; ++m) {
      double a = double(p) * std::pow(theta, -2.0 * m / hd);
      EXPECT_EQ(tab.cos[p * hd / 2 + m], static_cast<float>(std::cos(a)));
      EXPECT_EQ(tab.sin[p * hd / 2 + m], static_cast<float>(std::sin(a)));
    }
  std::vector<int32_t> pos(B * T);
  for (i64 i = 0; i < B * T; ++i) pos[i] = static_cast<int32_t>((i * 389) % maxp);
  for (const int32_t* pp : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(pos.data())}) {
    SCOPED_TRACE(pp ? "positions array" : "default positions");
    auto x = randn(B * T * stride, 51);
    for (i64 i = 0; i < B * T; ++i)
      for (i64 c = H * hd; c < stride; ++c) x[i * stride + c] = 7.f;  // padding must survive
    std::vector<double> want = to_double(x);
    ref_rope(want, B, T, H, hd, stride, pp, theta);
    auto y = x;
    ops::rope_forward(tab, y.data(), B, T, H, stride, pp);
    EXPECT_TRUE(close_rel(y, want, 1e-6, "rope forward"));
    for (i64 i = 0; i < B * T; ++i)
      for (i64 c = H * hd; c < stride; ++c) ASSERT_EQ(y[i * stride + c], 7.f);

    // Backward = gradient of <G, rope(x)> w.r.t. x, checked by central FD through the double reference.
    auto G = randn(B * T * stride, 52);
    for (i64 i = 0; i < B * T; ++i)
      for (i64 c = H * hd; c < stride; ++c) G[i * stride + c] = 0.f;
    std::vector<double> xd = to_double(x);
    auto loss = [&]() {
      auto r = xd;
      ref_rope(r, B, T, H, hd, stride, pp, theta);
      double s = 0;
      for (size_t i = 0; i < r.size(); ++i) s += r[i] * G[i];
      return s;
    };
    std::vector<double> fd(xd.size());
    for (size_t i = 0; i < fd.size(); ++i) fd[i] = fd_grad(xd, i, loss, 1e-3);
    auto dx = G;
    ops::rope_backward(tab, dx.data(), B, T, H, stride, pp);
    // Padding columns of dx stay as given (0 here), which is also their FD gradient.
    EXPECT_TRUE(close_rel(dx, fd, 1e-6, "rope backward"));
  }
  auto x = randn(B * T * stride, 53);
  pos[3] = static_cast<int32_t>(maxp);
  EXPECT_THROW(ops::rope_forward(tab, x.data(), B, T, H, stride, pos.data()), Error);
  ops::RopeTable small(8, hd, theta);
  EXPECT_THROW(ops::rope_forward(small, x.data(), B, T, H, stride), Error);  // T > max_pos
  EXPECT_THROW(ops::rope_forward(tab, x.data(), B, T, H, H * hd - 1), Error);
  EXPECT_THROW(ops::RopeTable(8, 7, theta), Error);  // odd head_dim
}

TEST(RoPE, ScoresDependOnlyOnRelativePosition) {
  const i64 hd = 64, maxp = 4096;
  ops::RopeTable tab(maxp, hd, 10000.0);
  auto q0 = randn(hd, 61), k0 = randn(hd, 62);
  auto score = [&](int32_t pq, int32_t pk) {
    auto q = q0, k = k0;
    ops::rope_forward(tab, q.data(), 1, 1, 1, hd, &pq);
    ops::rope_forward(tab, k.data(), 1, 1, 1, hd, &pk);
    double s = 0;
    for (i64 i = 0; i < hd; ++i) s += double(q[i]) * k[i];
    return s;
  };
  double norm = 0;
  for (i64 i = 0; i < hd; ++i) norm += std::fabs(double(q0[i]) * k0[i]);
  for (auto [p, pp] : {std::pair{5, 2}, std::pair{100, 37}, std::pair{7, 300}})
    for (int d : {1, 17, 1000, 3000}) {
      // fp32 tables: the per-element rounding of cos/sin (<= 6e-8) bounds the difference.
      EXPECT_NEAR(score(p, pp), score(p + d, pp + d), 1e-5 * norm) << p << " " << pp << " +" << d;
    }
  // And the score does change with the offset (the property is not vacuous).
  EXPECT_GT(std::fabs(score(5, 2) - score(5, 3)), 1e-3);
}

// ------------------------------------ LM head cross-entropy ----------------------------------------
namespace {
// Reference: loss_sum = sum over counted rows of lse(h W^T) - logit[target], all in double.
double ref_ce(const std::vector<double>& h, const std::vector<double>& W, const std::vector<int32_t>& tg, i64 N,
              i64 D, i64 V, std::vector<double>* lse = nullptr, std::vector<double>* tl = nullptr,
              std::vector<double>* dh = nullptr, std::vector<double>* dW = nullptr, double scale = 1.0) {
  double total = 0;
  if (lse) lse->assign(N, 0);
  if (tl) tl->assign(N, 0);
  if (dh) dh->assign(N * D, 0);
  if (dW) dW->assign(V * D, 0);
  std::vector<double> z(V);
  for (i64 n = 0; n < N; ++n) {
    double m = -1e300;
    for (i64 v = 0; v < V; ++v) {
      double s = 0;
      for (i64 d = 0; d < D; ++d) s += h[n * D + d] * W[v * D + d];
      z[v] = s;
      m = std::max(m, s);
    }
    double se = 0;
    for (i64 v = 0; v < V; ++v) se += std::exp(z[v] - m);
    double l = m + std::log(se);
    if (lse) (*lse)[n] = l;
    if (tg[n] < 0) continue;
    total += l - z[tg[n]];
    if (tl) (*tl)[n] = l - z[tg[n]];
    if (dh)
      for (i64 v = 0; v < V; ++v) {
        double g = (std::exp(z[v] - l) - (v == tg[n] ? 1.0 : 0.0)) * scale;
        for (i64 d = 0; d < D; ++d) {
          (*dh)[n * D + d] += g * W[v * D + d];
          (*dW)[v * D + d] += g * h[n * D + d];
        }
      }
  }
  return total;
}

struct CeCase {
  i64 N, D, V;
  std::vector<float> h, W;
  std::vector<int32_t> tg;
  CeCase(i64 N_, i64 D_, i64 V_, uint64_t seed) : N(N_), D(D_), V(V_) {
    h = randn(N * D, seed, 1.0);
    W = randn(V * D, seed + 1, 0.3);  // logits ~ N(0, 0.3^2 D): a peaked, realistic softmax
    tg = rand_tokens(N, V, seed + 2);
    tg[1] = -1, tg[N / 2] = -100;  // ignored rows
    tg[2] = 0, tg[3] = static_cast<int32_t>(V - 1);
  }
};
}  // namespace

TEST(LmHeadCE, ForwardMatchesReferenceForEveryGridAndOddTiles) {
  CeCase c(37, 45, 103, 71);
  std::vector<double> lse_ref, tl_ref;
  double want = ref_ce(to_double(c.h), to_double(c.W), c.tg, c.N, c.D, c.V, &lse_ref, &tl_ref);
  // Odd tiles (8 rows x 24 vocab: the chunk does not divide V) and default tiles; every grid shape.
  for (ops::CeTiling tl : {ops::CeTiling{8, 24, 1, 1}, ops::CeTiling{8, 24, 3, 1}, ops::CeTiling{8, 24, 1, 4},
                           ops::CeTiling{8, 24, 2, 3}, ops::CeTiling{5, 103, 2, 1}, ops::CeTiling{}}) {
    SCOPED_TRACE(::testing::Message() << "tiles " << tl.rows << "x" << tl.cols << " grid " << tl.grid_p << "x"
                                    << tl.grid_q);
    auto lse = nan_vec(c.N), tl_loss = nan_vec(c.N);
    double got = ops::lm_head_ce_forward(c.h.data(), c.W.data(), c.tg.data(), c.N, c.D, c.V, lse.data(),
                                         tl_loss.data(), tl);
    EXPECT_NEAR(got, want, 1e-6 * std::fabs(want));
    EXPECT_TRUE(close_rel(lse, lse_ref, 1e-6, "lse"));
    EXPECT_TRUE(close_rel(tl_loss, tl_ref, 1e-6, "token_loss"));
    EXPECT_EQ(tl_loss[1], 0.f);
    EXPECT_EQ(tl_loss[c.N / 2], 0.f);
  }
  // Default signature, no token_loss.
  auto lse = nan_vec(c.N);
  double got = ops::lm_head_ce_forward(c.h.data(), c.W.data(), c.tg.data(), c.N, c.D, c.V, lse.data());
  EXPECT_NEAR(got, want, 1e-6 * std::fabs(want));
  auto bad = c.tg;
  bad[4] = static_cast<int32_t>(c.V);
  EXPECT_THROW(ops::lm_head_ce_forward(c.h.data(), c.W.data(), bad.data(), c.N, c.D, c.V, lse.data()), Error);
}

TEST(LmHeadCE, BackwardMatchesFiniteDifferencesForEveryGrid) {
  CeCase c(37, 45, 103, 81);
  const double scale = 1.0 / 35.0;  // 1 / counted rows
  std::vector<double> hd = to_double(c.h), Wd = to_double(c.W);
  auto loss = [&]() { return scale * ref_ce(hd, Wd, c.tg, c.N, c.D, c.V); };
  // Central FD of the double reference: every element of h, every 5th element of W (keeps it < 1 s).
  std::vector<double> dh_fd(c.N * c.D);
  for (size_t i = 0; i < dh_fd.size(); ++i) dh_fd[i] = fd_grad(hd, i, loss, 1e-5);
  std::vector<size_t> widx;
  for (size_t i = 0; i < Wd.size(); i += 5) widx.push_back(i);
  std::vector<double> dW_fd;
  for (size_t i : widx) dW_fd.push_back(fd_grad(Wd, i, loss, 1e-5));

  auto dW0 = randn(c.V * c.D, 82, 0.01);
  std::vector<float> first_dh, first_dW;
  for (ops::CeTiling tl : {ops::CeTiling{8, 24, 1, 1}, ops::CeTiling{8, 24, 3, 1}, ops::CeTiling{8, 24, 1, 4},
                           ops::CeTiling{8, 24, 2, 3}, ops::CeTiling{5, 103, 2, 1}, ops::CeTiling{}}) {
    SCOPED_TRACE(::testing::Message() << "tiles " << tl.rows << "x" << tl.cols << " grid " << tl.grid_p << "x"
                                    << tl.grid_q);
    auto lse = nan_vec(c.N);
    ops::lm_head_ce_forward(c.h.data(), c.W.data(), c.tg.data(), c.N, c.D, c.V, lse.data(), nullptr, tl);
    auto dh = nan_vec(c.N * c.D);
    auto dW = dW0;
    ops::lm_head_ce_backward(c.h.data(), c.W.data(), c.tg.data(), lse.data(), c.N, c.D, c.V,
                             static_cast<float>(scale), dh.data(), dW.data(), tl);
    EXPECT_TRUE(close_rel(dh, dh_fd, 1e-5, "dh"));
    std::vector<double> dW_sel;
    for (size_t k = 0; k < widx.size(); ++k) dW_sel.push_back(double(dW[widx[k]]) - dW0[widx[k]]);
    EXPECT_TRUE(close_rel(dW_sel, dW_fd, 1e-5, "dW (accumulated onto dW0)"));
    for (i64 d = 0; d < c.D; ++d) ASSERT_EQ(dh[1 * c.D + d], 0.f);  // ignored row
    // Same tiling and grid twice: bit-identical.
    auto dh2 = nan_vec(c.N * c.D);
    auto dW2 = dW0;
    ops::lm_head_ce_backward(c.h.data(), c.W.data(), c.tg.data(), lse.data(), c.N, c.D, c.V,
                             static_cast<float>(scale), dh2.data(), dW2.data(), tl);
    EXPECT_EQ(0, std::memcmp(dh.data(), dh2.data(), dh.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(dW.data(), dW2.data(), dW.size() * sizeof(float)));
  }
}

TEST(LmHeadCE, ForwardBackwardInOnePassMatchesReferenceForEveryGrid) {
  CeCase c(37, 45, 103, 83);
  const double scale = 1.0 / 35.0;  // 1 / counted rows
  std::vector<double> lse_ref, tl_ref, dh_ref, dW_ref;
  const double want = ref_ce(to_double(c.h), to_double(c.W), c.tg, c.N, c.D, c.V, &lse_ref, &tl_ref, &dh_ref,
                             &dW_ref, scale);
  const auto dW0 = randn(c.V * c.D, 84, 0.01);
  // Row blocks of 8 and 5 (neither divides N) on 1 and 3 row groups, the default block, and vocab groups (which
  // make the two calls instead).
  ops::CeTiling odd1{8, 24, 1, 1, 8}, odd3{8, 24, 3, 1, 5}, vocab_groups{8, 24, 2, 3};
  for (const ops::CeTiling& tl : {odd1, odd3, ops::CeTiling{}, vocab_groups}) {
    SCOPED_TRACE(::testing::Message() << "fused rows " << tl.fused_rows << " grid " << tl.grid_p << "x" << tl.grid_q);
    auto lse = nan_vec(c.N), token_loss = nan_vec(c.N), dh = nan_vec(c.N * c.D);
    auto dW = dW0;
    const double got = ops::lm_head_ce_forward_backward(c.h.data(), c.W.data(), c.tg.data(), c.N, c.D, c.V,
                                                        static_cast<float>(scale), lse.data(), token_loss.data(),
                                                        dh.data(), dW.data(), tl);
    EXPECT_NEAR(got, want, 1e-6 * std::fabs(want));
    EXPECT_TRUE(close_rel(lse, lse_ref, 1e-6, "lse"));
    EXPECT_TRUE(close_rel(token_loss, tl_ref, 1e-6, "token_loss"));
    EXPECT_TRUE(close_rel(dh, dh_ref, 1e-5, "dh"));
    std::vector<double> dW_added(dW.size());
    for (size_t k = 0; k < dW.size(); ++k) dW_added[k] = double(dW[k]) - dW0[k];
    EXPECT_TRUE(close_rel(dW_added, dW_ref, 1e-5, "dW (accumulated onto dW0)"));
    for (i64 d = 0; d < c.D; ++d) ASSERT_EQ(dh[1 * c.D + d], 0.f);  // ignored rows
    EXPECT_EQ(token_loss[c.N / 2], 0.f);
    // Same tiling and grid twice: bit-identical.
    auto dh2 = nan_vec(c.N * c.D);
    auto dW2 = dW0;
    auto lse2 = nan_vec(c.N);
    EXPECT_EQ(got, ops::lm_head_ce_forward_backward(c.h.data(), c.W.data(), c.tg.data(), c.N, c.D, c.V,
                                                    static_cast<float>(scale), lse2.data(), nullptr, dh2.data(),
                                                    dW2.data(), tl));
    EXPECT_EQ(0, std::memcmp(dh.data(), dh2.data(), dh.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(dW.data(), dW2.data(), dW.size() * sizeof(float)));
  }
  auto bad = c.tg;
  bad[4] = static_cast<int32_t>(c.V);
  auto lse = nan_vec(c.N), dh = nan_vec(c.N * c.D);
  auto dW = dW0;
  EXPECT_THROW(ops::lm_head_ce_forward_backward(c.h.data(), c.W.data(), bad.data(), c.N, c.D, c.V, 1.f, lse.data(),
                                                nullptr, dh.data(), dW.data()),
               Error);
}

TEST(LmHeadCE, ForwardBackwardInOnePassOnSeveralThreadsMatchesReference) {
  // Default blocks (whole rows, the last block partial), 1, 2 and 4 row groups; analytic double gradient.
  CeCase c(300, 64, 1100, 93);
  const double scale = 0.5;
  std::vector<double> lse_ref, dh_ref, dW_ref;
  const double want = ref_ce(to_double(c.h), to_double(c.W), c.tg, c.N, c.D, c.V, &lse_ref, nullptr, &dh_ref,
                             &dW_ref, scale);
  for (int nt : {1, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << nt << " threads");
    with_threads(nt, [&] {
      auto lse = nan_vec(c.N), dh = nan_vec(c.N * c.D);
      std::vector<float> dW(c.V * c.D, 0.f);
      const double got = ops::lm_head_ce_forward_backward(c.h.data(), c.W.data(), c.tg.data(), c.N, c.D, c.V,
                                                          static_cast<float>(scale), lse.data(), nullptr, dh.data(),
                                                          dW.data());
      EXPECT_NEAR(got, want, 1e-6 * std::fabs(want));
      EXPECT_TRUE(close_rel(lse, lse_ref, 1e-6, "lse"));
      EXPECT_TRUE(close_rel(dh, dh_ref, 1e-5, "dh"));
      EXPECT_TRUE(close_rel(dW, dW_ref, 1e-5, "dW"));
    });
  }
}

TEST(LmHeadCE, ForwardBackwardInACallersWorkspaceGivesTheSameBits) {
  // The fused pass's buffers (dW partials, logits blocks) in a workspace the caller owns (the training arena's free
  // region), on 1 and 3 row groups: bitwise what its own buffers give; a workspace one float too small is not used.
  CeCase c(37, 45, 103, 85);
  const auto dW0 = randn(c.V * c.D, 86, 0.01);
  ops::CeTiling one{8, 24, 1, 1, 8}, three{8, 24, 3, 1, 5};
  for (const ops::CeTiling& tl : {one, three}) {
    SCOPED_TRACE(::testing::Message() << tl.grid_p << " row groups");
    const i64 need = ops::lm_head_ce_workspace_floats(c.N, c.D, c.V, tl);
    // dW partials of the groups but the first, then a block of fused_rows padded rows per group.
    EXPECT_EQ(need, (tl.grid_p - 1) * c.V * c.D + tl.grid_p * tl.fused_rows * (c.V + 16));
    auto run = [&](float* ws, i64 ws_floats, std::vector<float>& lse, std::vector<float>& dh, std::vector<float>& dW) {
      lse = nan_vec(c.N), dh = nan_vec(c.N * c.D), dW = dW0;
      return ops::lm_head_ce_forward_backward(c.h.data(), c.W.data(), c.tg.data(), c.N, c.D, c.V, 0.25f, lse.data(),
                                              nullptr, dh.data(), dW.data(), tl, ws, ws_floats);
    };
    std::vector<float> lse_own, dh_own, dW_own, lse_ws, dh_ws, dW_ws;
    const double own = run(nullptr, 0, lse_own, dh_own, dW_own);
    aligned_vector<float> ws(static_cast<size_t>(need), std::numeric_limits<float>::quiet_NaN());
    for (i64 size : {need - 1, need}) {
      EXPECT_EQ(own, run(ws.data(), size, lse_ws, dh_ws, dW_ws));
      EXPECT_EQ(0, std::memcmp(lse_own.data(), lse_ws.data(), lse_own.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(dh_own.data(), dh_ws.data(), dh_own.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(dW_own.data(), dW_ws.data(), dW_own.size() * sizeof(float)));
      // Used (written over its NaNs) only when large enough.
      EXPECT_EQ(size == need, !std::isnan(ws[0])) << "workspace of " << size << " floats, " << need << " needed";
    }
  }
  // The two-call path (vocab groups) needs none.
  EXPECT_EQ(0, ops::lm_head_ce_workspace_floats(c.N, c.D, c.V, ops::CeTiling{8, 24, 2, 3}));
}

TEST(LmHeadCE, DefaultTilesOnSeveralChunksMatchReference) {
  // Several default row tiles and vocab chunks, the last of each partial; analytic double gradient.
  CeCase c(300, 64, 1100, 91);
  const double scale = 0.5;
  std::vector<double> lse_ref, dh_ref, dW_ref;
  double want = ref_ce(to_double(c.h), to_double(c.W), c.tg, c.N, c.D, c.V, &lse_ref, nullptr, &dh_ref, &dW_ref,
                       scale);
  for (int nt : {1, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << nt << " threads");
    with_threads(nt, [&] {
      auto lse = nan_vec(c.N);
      double got = ops::lm_head_ce_forward(c.h.data(), c.W.data(), c.tg.data(), c.N, c.D, c.V, lse.data());
      EXPECT_NEAR(got, want, 1e-6 * std::fabs(want));
      EXPECT_TRUE(close_rel(lse, lse_ref, 1e-6, "lse"));
      auto dh = nan_vec(c.N * c.D);
      std::vector<float> dW(c.V * c.D, 0.f);
      ops::lm_head_ce_backward(c.h.data(), c.W.data(), c.tg.data(), lse.data(), c.N, c.D, c.V,
                               static_cast<float>(scale), dh.data(), dW.data());
      EXPECT_TRUE(close_rel(dh, dh_ref, 1e-5, "dh"));
      EXPECT_TRUE(close_rel(dW, dW_ref, 1e-5, "dW"));
    });
  }
}
