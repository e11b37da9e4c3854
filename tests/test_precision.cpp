// --precision bf16 (ops/precision.h, ops/matmul_bf16.h): the rounding, the bf16 matmul against references, the
// linear layers and the LM head under the scope, a model's gradients against fp32, and the CLI's refusal where the
// CPU has no native bf16. Tolerances (docs/precision.md): bf16 operand rounding has unit roundoff
// u_bf = 2^-8, and its stages count in the depth model of docs/testing.md on that unit: rel RMS <= 4 u_bf sqrt(N).
// Tests that run bf16 matmuls skip on CPUs where oneDNN has none (x86-64 without AVX-512); the refusal test runs
// everywhere (it caps oneDNN at AVX2 on machines that do have bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli_harness.h"
#include "model/model.h"
#include "ops/bf16_pairs.h"
#include "ops/cross_entropy.h"
#include "ops/matmul.h"
#include "ops/matmul_bf16.h"
#include "ops/precision.h"
#include "ops/transpose.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::testing;
using ops::bf16;

namespace {

std::vector<float> rounded(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = ops::from_bf16(ops::to_bf16(x[i]));
  return r;
}

#define SKIP_WITHOUT_BF16_MATMUL()                                                            \
  if (!ops::bf16_matmul_available()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (" \
                                                  << ops::bf16_native_missing() << ")"

// C = alpha op(A) op(B) + beta C in double (row-major, row strides).
std::vector<double> ref_matmul(bool ta, bool tb, i64 M, i64 N, i64 K, double alpha, const std::vector<float>& A,
                               i64 lda, const std::vector<float>& B, i64 ldb, double beta, const std::vector<float>& C,
                               i64 ldc) {
  std::vector<double> out;
  for (i64 i = 0; i < M; ++i)
    for (i64 j = 0; j < N; ++j) {
      double s = 0;
      for (i64 p = 0; p < K; ++p) s += double(ta ? A[p * lda + i] : A[i * lda + p]) * (tb ? B[j * ldb + p] : B[p * ldb + j]);
      out.push_back(alpha * s + (beta == 0 ? 0.0 : beta * C[i * ldc + j]));
    }
  return out;
}
std::vector<float> dense(const std::vector<float>& C, i64 M, i64 N, i64 ldc) {
  std::vector<float> out;
  for (i64 i = 0; i < M; ++i)
    for (i64 j = 0; j < N; ++j) out.push_back(C[i * ldc + j]);
  return out;
}

}  // namespace

TEST(Bf16, RoundingIsToNearestEvenAndKeepsSpecialValues) {
  EXPECT_EQ(ops::to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(ops::to_bf16(bits_float(0x3f808000u)), 0x3f80);  // tie, 0x3f80 even: down
  EXPECT_EQ(ops::to_bf16(bits_float(0x3f818000u)), 0x3f82);  // tie, 0x3f81 odd: up
  EXPECT_EQ(ops::to_bf16(bits_float(0x3f808001u)), 0x3f81);  // just above the tie: up
  EXPECT_EQ(ops::to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(ops::to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(ops::to_bf16(bits_float(0x7f7fffffu)), 0x7f80);  // fp32 max rounds up to infinity
  EXPECT_TRUE(std::isnan(ops::from_bf16(ops::to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(ops::from_bf16(ops::to_bf16(bits_float(0x7f800001u)))));  // a NaN whose top half is inf
  // Every rounding is to the nearer of the two neighbouring bf16 values: |x - bf16(x)| <= 2^-8 |x|.
  Rng r(3);
  for (int i = 0; i < 100000; ++i) {
    const float x = static_cast<float>(r.normal() * std::exp(r.normal() * 10));
    const float y = ops::from_bf16(ops::to_bf16(x));
    const float lo = bits_float(float_bits(x) & 0xffff0000u), hi = bits_float((float_bits(x) & 0xffff0000u) + 0x10000u);
    ASSERT_LE(std::fabs(double(y) - x), std::fabs(double(x) - (std::fabs(double(x) - lo) <= std::fabs(double(x) - hi) ? lo : hi)) + 0.0)
        << x;
    ASSERT_LE(std::fabs(double(y) - x), kBf16UnitRoundoff * std::fabs(double(x))) << x;
  }
  // The array form, with a source row stride.
  const std::vector<float> src = {1.f, 2.f, 99.f, 3.f, 4.f, 99.f};
  std::vector<bf16> dst(4);
  ops::round_to_bf16(src.data(), 2, 2, 3, dst.data());
  EXPECT_EQ(dst, (std::vector<bf16>{0x3f80, 0x4000, 0x4040, 0x4080}));
}

namespace {
// C = alpha op(A) op(B) + beta C by `product` (fp32 operands in, rounding its own business) in all four layouts,
// beta 0, 1 and 1/2, strided rows, K odd, against double products of the rounded and of the fp32 operands. alpha is
// `alpha_half` with beta = 1/2, else 1.
using Product = std::function<void(bool ta, bool tb, i64 M, i64 N, i64 K, float alpha, const std::vector<float>& A,
                                   i64 lda, const std::vector<float>& B, i64 ldb, float beta, float* C, i64 ldc)>;
void expect_bf16_product_in_every_layout(const Product& product, float alpha_half) {
  const i64 M = 37, N = 29, K = 75;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 1.f, 0.5f}) {
        const float alpha = beta == 0.5f ? alpha_half : 1.f;
        const i64 lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;  // row strides wider than rows
        const auto A = randn(static_cast<size_t>((ta ? K : M) * lda), 1);
        const auto B = randn(static_cast<size_t>((tb ? N : K) * ldb), 2);
        auto C = randn(static_cast<size_t>(M * ldc), 3);
        const auto C0 = C;
        product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C.data(), ldc);
        const std::string what = fmt::format("ta={} tb={} beta={}", ta, tb, beta);
        const double acc_tol = fp32_tol(fp32_depth({double(K), 2}));
        // Against the exact product of the rounded operands: only fp32 accumulation (K, plus the beta term).
        EXPECT_TRUE(close_rel(dense(C, M, N, ldc),
                              ref_matmul(ta, tb, M, N, K, alpha, rounded(A), lda, rounded(B), ldb, beta, C0, ldc),
                              acc_tol)) << what;
        // Against the fp32 operands: the two roundings of each product (u_bf each).
        EXPECT_TRUE(close_rel(dense(C, M, N, ldc), ref_matmul(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc),
                              bf16_tol(2))) << what;
        // Padding between rows is left alone.
        for (i64 i = 0; i < M; ++i)
          for (i64 j = N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], C0[i * ldc + j]) << what;
      }
}
}  // namespace

TEST(Bf16, MatmulMatchesDoubleOfTheRoundedOperandsInEveryLayout) {
  SKIP_WITHOUT_BF16_MATMUL();
  expect_bf16_product_in_every_layout(
      [](bool ta, bool tb, i64 M, i64 N, i64 K, float alpha, const std::vector<float>& A, i64 lda,
         const std::vector<float>& B, i64 ldb, float beta, float* C, i64 ldc) {
        ops::matmul_bf16(ta, tb, M, N, K, alpha, bf16_rounded(A).data(), lda, bf16_rounded(B).data(), ldb, beta, C, ldc);
      },
      0.75f);
}

// ops::matmul_bf16_out (the bf16 step's gate|up): bf16 operands, fp32 accumulation, the result rounded once to bf16 as
// it is written; all four layouts, alpha != 1, strided rows. Against the double product of the rounded operands: fp32
// accumulation plus one bf16 rounding; row padding left alone; and linear_forward_to_bf16 within one bf16 step of
// linear_forward's fp32 output under bf16, rounded (the same rounded products, summed in fp32 either way).
TEST(Bf16, MatmulWithBf16OutputIsTheProductRoundedOnce) {
  SKIP_WITHOUT_BF16_MATMUL();
  const i64 M = 37, N = 29, K = 75;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const i64 lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
      const auto A = randn(static_cast<size_t>((ta ? K : M) * lda), 1);
      const auto B = randn(static_cast<size_t>((tb ? N : K) * ldb), 2);
      std::vector<bf16> C(static_cast<size_t>(M * ldc), 0xdead);
      ops::matmul_bf16_out(ta, tb, M, N, K, 0.75f, bf16_rounded(A).data(), lda, bf16_rounded(B).data(), ldb, C.data(),
                           ldc);
      const std::vector<float> zero(C.size(), 0.f);
      EXPECT_TRUE(close_rel(dense(widened(C), M, N, ldc),
                            ref_matmul(ta, tb, M, N, K, 0.75, rounded(A), lda, rounded(B), ldb, 0.0, zero, ldc),
                            fp32_tol(fp32_depth({double(K)})) + bf16_tol(1)))
          << "ta=" << ta << " tb=" << tb;
      for (i64 i = 0; i < M; ++i)
        for (i64 j = N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], 0xdead) << "row padding written, ta=" << ta;
    }
  const i64 rows = 33, in = 40, out = 24;
  const auto x = randn(static_cast<size_t>(rows * in), 4), W = randn(static_cast<size_t>(out * in), 5, 0.2);
  const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
  std::vector<float> y(rows * out);
  ops::linear_forward(x.data(), W.data(), y.data(), rows, in, out);
  std::vector<bf16> yb(rows * out);
  ops::linear_forward_to_bf16(x.data(), W.data(), yb.data(), rows, in, out);
  const auto want = bf16_rounded(y);
  for (size_t i = 0; i < yb.size(); ++i)
    ASSERT_LE(std::abs(int(yb[i]) - int(want[i])), 1) << i << ": " << ops::from_bf16(yb[i]) << " against " << y[i];
}

// The scans' small products (ops/bf16_pairs.h gemm; its alpha scales A before the rounding, so a power of two keeps
// the reference exact).
TEST(Bf16, PairGemmMatchesDoubleOfTheRoundedOperandsInEveryLayout) {
  if (!ops::bf16_pairs::available()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  for_each_bf16_product_path([] {
    expect_bf16_product_in_every_layout(
      [](bool ta, bool tb, i64 M, i64 N, i64 K, float alpha, const std::vector<float>& A, i64 lda,
         const std::vector<float>& B, i64 ldb, float beta, float* C, i64 ldc) {
        ops::bf16_pairs::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C, ldc);
      },
      -0.5f);
  });
}

// The packing passes word for word: each pair word holds ops::to_bf16 of its two (scaled) values, low index in the low
// half. Widths with whole vectors and tails, odd counts (a zero high half), mul 1 and mul != 1.
TEST(Bf16, PackingPassesHoldEachValueRoundedOnce) {
  if (!ops::bf16_pairs::available()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  using ops::bf16_pairs::Pair;
  const i64 stride = 101;
  const auto src = randn(static_cast<size_t>(40 * stride), 7);
  auto word = [](float lo, float hi) { return Pair{ops::to_bf16(lo)} | Pair{ops::to_bf16(hi)} << 16; };
  for (float mul : {1.f, -0.375f})
    for (i64 cols : {1, 16, 31, 32, 33, 64, 75, 96}) {
      const int n = 21;
      const i64 np = (cols + 1) / 2;
      // Past cols the kernels multiply a zero too: -0 for mul < 0.
      auto at = [&](i64 r, i64 c) { return (c < cols ? src[r * stride + c] : 0.f) * mul; };
      // round_rows: dst[r][p] = (row r, columns 2p and 2p + 1).
      std::vector<Pair> d(static_cast<size_t>(n * (np + 2)), 0xdeadbeef);
      ops::bf16_pairs::round_rows(src.data(), stride, n, cols, mul, d.data(), np + 2);
      for (i64 r = 0; r < n; ++r)
        for (i64 p = 0; p < np + 2; ++p)
          ASSERT_EQ(d[r * (np + 2) + p], p < np ? word(at(r, 2 * p), at(r, 2 * p + 1)) : Pair{0xdeadbeef})
              << "round_rows mul=" << mul << " cols=" << cols << " r=" << r << " p=" << p;
      // round_rows_t: its transpose, rows n..n_out zero.
      const int n_out = 32;
      std::vector<Pair> t(static_cast<size_t>(np * n_out));
      ops::bf16_pairs::round_rows_t(src.data(), stride, n, cols, mul, t.data(), n_out, n_out);
      for (i64 p = 0; p < np; ++p)
        for (i64 r = 0; r < n_out; ++r)
          ASSERT_EQ(t[p * n_out + r], r < n ? word(at(r, 2 * p), at(r, 2 * p + 1)) : Pair{0})
              << "round_rows_t mul=" << mul << " cols=" << cols << " r=" << r << " p=" << p;
      // pair_rows: dst[p][c] = (rows 2p and 2p + 1, column c), rows outside [r_lo, r_hi] zero.
      const int r_lo = 1, r_hi = n - 1, p1 = (n + 1) / 2;
      std::vector<Pair> q(static_cast<size_t>(p1 * cols), 0xdeadbeef);
      ops::bf16_pairs::pair_rows(src.data(), stride, r_lo, r_hi, 0, p1, cols, q.data(), cols, mul);
      auto in = [&](i64 r, i64 c) { return r >= r_lo && r <= r_hi ? at(r, c) : 0.f; };
      for (i64 p = 0; p < p1; ++p)
        for (i64 c = 0; c < cols; ++c)
          ASSERT_EQ(q[p * cols + c], word(in(2 * p, c), in(2 * p + 1, c)))
              << "pair_rows mul=" << mul << " cols=" << cols << " p=" << p << " c=" << c;
    }
}

TEST(Bf16, LinearLayersRoundBothOperandsUnderTheScope) {
  SKIP_WITHOUT_BF16_MATMUL();
  const i64 N = 33, in = 40, out = 24;
  const auto x = randn(static_cast<size_t>(N * in), 4), W = randn(static_cast<size_t>(out * in), 5, 0.2);
  const auto dy = randn(static_cast<size_t>(N * out), 6);
  const auto xr = rounded(x), Wr = rounded(W), dyr = rounded(dy);
  // fp32 reference on the rounded operands (what bf16 computes, up to fp32 accumulation order).
  std::vector<float> y_ref(N * out), dx_ref(N * in, 0.f), dW_ref(out * in, 0.5f);
  ops::linear_forward(xr.data(), Wr.data(), y_ref.data(), N, in, out);
  ops::linear_backward(xr.data(), Wr.data(), dyr.data(), dx_ref.data(), dW_ref.data(), N, in, out);
  std::vector<float> y32(N * out);
  ops::linear_forward(x.data(), W.data(), y32.data(), N, in, out);

  const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
  EXPECT_EQ(ops::precision(), ops::Precision::bf16);
  std::vector<float> y(N * out), dx = nan_vec(N * in), dW(out * in, 0.5f);
  ops::linear_forward(x.data(), W.data(), y.data(), N, in, out);
  ops::linear_backward(x.data(), W.data(), dy.data(), dx.data(), dW.data(), N, in, out);
  // Two fp32 accumulations of the same rounded products (docs/testing.md: both sides' depths).
  EXPECT_TRUE(close_rel(y, y_ref, fp32_tol(2.0 * in)));
  EXPECT_TRUE(close_rel(dx, dx_ref, fp32_tol(2.0 * out)));
  EXPECT_TRUE(close_rel(dW, dW_ref, fp32_tol(2.0 * N)));  // accumulated onto 0.5
  // And it is really bf16: the fp32 product differs by about the rounding of the operands.
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) num += (y[i] - y32[i]) * (y[i] - y32[i]), den += y32[i] * y32[i];
  EXPECT_GT(std::sqrt(num / den), 0.1 * kBf16UnitRoundoff);
  EXPECT_LT(std::sqrt(num / den), bf16_tol(2));
  // accumulate_dx adds onto dx.
  std::vector<float> dx2 = dx;
  ops::linear_backward(x.data(), W.data(), dy.data(), dx2.data(), nullptr, N, in, out, /*accumulate_dx=*/true);
  for (size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(dx2[i], 2 * dx[i], 1e-5 * (1 + std::fabs(dx[i])));
}

// A linear layer handed operands that were rounded already (ops::linear_*_bf16, x transposed for the weight
// gradient as linear_backward rounds it) gives the bits of linear_* under bf16 on the fp32 values; x in rows gives
// the same weight gradient up to fp32 accumulation order.
TEST(Bf16, LinearLayersOnRoundedOperandsGiveTheSameBits) {
  SKIP_WITHOUT_BF16_MATMUL();
  const i64 N = 45, in = 40, out = 24;
  const auto x = randn(static_cast<size_t>(N * in), 31), W = randn(static_cast<size_t>(out * in), 32, 0.2);
  const auto dy = randn(static_cast<size_t>(N * out), 33);
  const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
  std::vector<float> y(N * out), dx(N * in), dW(out * in, 0.25f);
  ops::linear_forward(x.data(), W.data(), y.data(), N, in, out);
  ops::linear_backward(x.data(), W.data(), dy.data(), dx.data(), dW.data(), N, in, out);
  const auto xb = bf16_rounded(x), dyb = bf16_rounded(dy);
  std::vector<ops::bf16> xt(N * in);
  ops::round_to_bf16_transposed(x.data(), N, in, in, xt.data());
  std::vector<float> y2(N * out), dx2 = nan_vec(N * in), dW2(out * in, 0.25f);
  ops::linear_forward_bf16(xb.data(), W.data(), y2.data(), N, in, out);
  ops::linear_backward_bf16(xt.data(), W.data(), dyb.data(), dx2.data(), dW2.data(), N, in, out,
                            /*accumulate_dx=*/false, /*xb_transposed=*/true);
  EXPECT_EQ(y2, y);
  EXPECT_EQ(dx2, dx);
  EXPECT_EQ(dW2, dW);
  std::vector<float> dW_rows(out * in, 0.25f);
  ops::linear_backward_bf16(xb.data(), W.data(), dyb.data(), nullptr, dW_rows.data(), N, in, out);
  EXPECT_TRUE(close_rel(dW_rows, dW, fp32_tol(2.0 * N)));
  // dx alone (no x), accumulating; dW alone.
  std::vector<float> dx3 = dx, dW3(out * in, 0.25f);
  ops::linear_backward_bf16(nullptr, W.data(), dyb.data(), dx3.data(), nullptr, N, in, out, /*accumulate_dx=*/true);
  std::vector<float> dx4 = dx;
  ops::linear_backward(x.data(), W.data(), dy.data(), dx4.data(), nullptr, N, in, out, /*accumulate_dx=*/true);
  EXPECT_EQ(dx3, dx4);
  ops::linear_backward_bf16(xt.data(), W.data(), dyb.data(), nullptr, dW3.data(), N, in, out,
                            /*accumulate_dx=*/false, /*xb_transposed=*/true);
  EXPECT_EQ(dW3, dW);
}

TEST(Bf16, LmHeadCrossEntropyMatchesFp32OnTheRoundedOperands) {
  SKIP_WITHOUT_BF16_MATMUL();
  const i64 N = 70, D = 48, V = 300;
  const auto h = randn(static_cast<size_t>(N * D), 7), W = randn(static_cast<size_t>(V * D), 8, 1.0 / std::sqrt(D));
  std::vector<int32_t> tg(N);
  Rng r(9);
  for (auto& t : tg) t = static_cast<int32_t>(r.below(V));
  tg[5] = -1;  // an ignored row
  const auto hr = rounded(h), Wr = rounded(W);
  ops::CeTiling tl;
  tl.rows = 16, tl.cols = 64;  // several tiles and vocab groups
  std::vector<float> lse_ref(N), dh_ref(N * D), dW_ref(V * D, 0.f);
  const double loss_ref = ops::lm_head_ce_forward(hr.data(), Wr.data(), tg.data(), N, D, V, lse_ref.data(), nullptr, tl);
  ops::lm_head_ce_backward(hr.data(), Wr.data(), tg.data(), lse_ref.data(), N, D, V, 0.5f, dh_ref.data(), dW_ref.data(), tl);

  const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
  std::vector<float> lse(N), dh = nan_vec(N * D), dW(V * D, 0.f);
  const double loss = ops::lm_head_ce_forward(h.data(), W.data(), tg.data(), N, D, V, lse.data(), nullptr, tl);
  ops::lm_head_ce_backward(h.data(), W.data(), tg.data(), lse.data(), N, D, V, 0.5f, dh.data(), dW.data(), tl);
  // Forward: the logits of the rounded operands, up to fp32 accumulation order (D twice, then exp/log and the
  // vocab sum).
  const double fwd_tol = fp32_tol(fp32_depth({2.0 * D, double(V), 2}));
  EXPECT_NEAR(loss, loss_ref, std::fabs(loss_ref) * fwd_tol);
  EXPECT_TRUE(close_rel(lse, lse_ref, fwd_tol));
  // Backward: the same, plus the bf16 rounding of dlogits (one u_bf stage).
  EXPECT_TRUE(close_rel(dh, dh_ref, bf16_tol(1)));
  EXPECT_TRUE(close_rel(dW, dW_ref, bf16_tol(1)));
  // Training's one-pass form (row blocks of 8, several blocks a row group): the same bounds.
  ops::CeTiling rows8;
  rows8.fused_rows = 8;
  std::vector<float> lse1(N), dh1 = nan_vec(N * D), dW1(V * D, 0.f);
  const double loss1 = ops::lm_head_ce_forward_backward(h.data(), W.data(), tg.data(), N, D, V, 0.5f, lse1.data(),
                                                        nullptr, dh1.data(), dW1.data(), rows8);
  EXPECT_NEAR(loss1, loss_ref, std::fabs(loss_ref) * fwd_tol);
  EXPECT_TRUE(close_rel(lse1, lse_ref, fwd_tol));
  EXPECT_TRUE(close_rel(dh1, dh_ref, bf16_tol(1)));
  EXPECT_TRUE(close_rel(dW1, dW_ref, bf16_tol(1)));
}

TEST(Bf16, ModelGradientsFollowFp32WithinTheBf16Bound) {
  SKIP_WITHOUT_BF16_MATMUL();
  // Every mixer kind, so each one's projections run through the bf16 path.
  const nlohmann::json j = {{"d_model", 32}, {"n_layers", 5}, {"n_heads", 4}, {"n_kv_heads", 2}, {"head_dim", 8},
                            {"d_ff", 48}, {"vocab_size", 61}, {"max_seq_len", 64}, {"pattern", "FSLMG"},
                            {"window", 5}};
  const ModelConfig cfg = ModelConfig::from_json(j, "test");
  const i64 B = 2, T = 40;
  std::vector<int32_t> in(B * T), tg(B * T);
  Rng r(11);
  for (i64 i = 0; i < B * T; ++i) in[i] = static_cast<int32_t>(r.below(61)), tg[i] = static_cast<int32_t>(r.below(61));
  auto run = [&](ops::Precision p, double* loss) {
    const ops::PrecisionScope scope(p, /*allow_emulated=*/true);
    Model m(cfg);
    m.init(5);
    m.plan(B, T);
    m.zero_grad();
    *loss = m.forward(in.data(), tg.data(), nullptr, B, T);
    m.backward(1.0f / (B * T));
    return std::vector<float>(m.grads(), m.grads() + m.param_floats());
  };
  double l32 = 0, l16 = 0;
  const auto g32 = run(ops::Precision::fp32, &l32), g16 = run(ops::Precision::bf16, &l16);
  EXPECT_EQ(ops::precision(), ops::Precision::fp32);  // the scope restored it
  // Depth in u_bf: along the forward chain 2 roundings per matmul (5 layers x 4 projections + the head = 21), the
  // MLP's gate|up output kept in bf16 (5) and, where the CPU has AVX512_BF16, the mixer kernels' own
  // (docs/precision.md: attention 4 for F and S, the scalar decay scan 6 for L and M, GDN 10; one chunk at T = 40):
  // 42 + 5 + 30 = 77; the backward chain again, and the weight-gradient product's 2: 156.
  EXPECT_NEAR(l16, l32, std::fabs(l32) * bf16_tol(77));
  EXPECT_NE(l16, l32);
  EXPECT_TRUE(close_rel(g16, g32, bf16_tol(156)));
  // Reproducible like fp32: the same step again gives the same bits.
  double again = 0;
  EXPECT_EQ(run(ops::Precision::bf16, &again), g16);
  EXPECT_EQ(again, l16);
}

// A bf16 step's arena differs from an fp32 one's: smaller, since each block keeps its gate|up in bf16, against the
// one bf16 operand its MLP backward adds. A model planned under bf16 that then steps under fp32 re-plans (grows) and
// gives the bits of one planned under fp32, and back.
TEST(Bf16, ModelPlannedInBf16StepsInFp32WithTheSameBits) {
  SKIP_WITHOUT_BF16_MATMUL();
  const nlohmann::json j = {{"d_model", 32}, {"n_layers", 2}, {"n_heads", 4}, {"n_kv_heads", 2}, {"head_dim", 8},
                            {"d_ff", 512}, {"vocab_size", 61}, {"max_seq_len", 64}, {"pattern", "FS"}, {"window", 5}};
  const ModelConfig cfg = ModelConfig::from_json(j, "test");
  const i64 B = 4, T = 64;
  std::vector<int32_t> in(B * T), tg(B * T);
  Rng r(12);
  for (i64 i = 0; i < B * T; ++i) in[i] = static_cast<int32_t>(r.below(61)), tg[i] = static_cast<int32_t>(r.below(61));
  auto step = [&](Model& m) {
    m.zero_grad();
    const double loss = m.forward(in.data(), tg.data(), nullptr, B, T);
    m.backward(1.0f / (B * T));
    return std::make_pair(loss, std::vector<float>(m.grads(), m.grads() + m.param_floats()));
  };
  Model fresh(cfg), replanned(cfg);
  fresh.init(5);
  replanned.init(5);
  std::pair<double, std::vector<float>> bf16;
  {
    const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
    replanned.plan(B, T);
    bf16 = step(replanned);
  }
  const double bf16_arena = static_cast<double>(replanned.arena_bytes());
  fresh.plan(B, T);  // fp32
  ASSERT_LT(bf16_arena, static_cast<double>(fresh.arena_bytes())) << "the fp32 step would not re-plan";
  const auto want = step(fresh);
  const auto got = step(replanned);
  EXPECT_EQ(got.first, want.first);
  EXPECT_EQ(got.second, want.second);
  EXPECT_NE(got.first, bf16.first);
  const ops::PrecisionScope bf(ops::Precision::bf16, /*allow_emulated=*/true);
  const auto back = step(replanned);
  EXPECT_EQ(back.first, bf16.first);
  EXPECT_EQ(back.second, bf16.second);
}

#ifdef HLM_BINARY
TEST(Bf16, CliRefusesBf16WithoutNativeSupportNamingTheFeature) {
  // ONEDNN_MAX_CPU_ISA=AVX2 hides AVX512_BF16 and AMX from oneDNN on a CPU that has them.
  const std::string cap = "ONEDNN_MAX_CPU_ISA=AVX2 ";
  CliResult r = run_cli("train " + tiny_model_flags() + tiny_corpus_flags() + "--steps 1 --seq-len 32 --precision bf16", cap);
  expect_cli_error(r, "AVX512_BF16 or AMX");
  EXPECT_NE(r.err.find("--precision fp32"), std::string::npos) << r.err;
  expect_cli_error(run_cli("bench " + tiny_model_flags() + "--seq-len 16 --batch 1 --precision bf16", cap),
                   "AVX512_BF16 or AMX");
  expect_cli_error(run_cli("train " + tiny_model_flags() + tiny_corpus_flags() + "--steps 1 --precision fp16"),
                   "--precision");
}

TEST(Bf16, CliTrainsInBf16AndRecordsItWhereTheCpuHasIt) {
  if (!ops::bf16_native_missing().empty()) GTEST_SKIP() << ops::bf16_native_missing();
  const std::string out = (cli_tmp_root() / "bf16_run").string();
  CliResult r = run_cli("train " + tiny_model_flags() + tiny_corpus_flags() +
                        "--steps 4 --seq-len 32 --batch 2 --eval-batches 2 --eval-every 2 --quiet --overwrite "
                        "--precision bf16 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto run = nlohmann::json::parse(slurp(out + "/run.json"));
  EXPECT_EQ(run.at("train").at("precision"), "bf16");
  // A resume keeps the run's precision unless told otherwise; fp32 may take over (a machine without bf16).
  r = run_cli("train --resume --steps 6 --quiet --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_cli("train --resume --steps 8 --quiet --precision fp32 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto b = nlohmann::json::parse(run_cli("bench " + tiny_model_flags() +
                                               "--seq-len 16 --batch 2 --steps 1 --warmup 0 --json --precision bf16").out);
  EXPECT_EQ(b.at("precision"), "bf16");
  // The attention and scan products ran in bf16 where the CPU has AVX512_BF16 (not under fp32).
  EXPECT_EQ(b.at("bf16_kernels").get<bool>(), ops::bf16_pairs::available());
  const auto f = nlohmann::json::parse(
      run_cli("bench " + tiny_model_flags() + "--seq-len 16 --batch 2 --steps 1 --warmup 0 --json").out);
  EXPECT_FALSE(f.at("bf16_kernels").get<bool>());
}
#endif
