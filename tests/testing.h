#pragma once
// Test helpers: the one tolerance policy (relative RMS error), NaN-filled outputs (a kernel that
// forgets to write fails loudly), random fills, and central finite differences in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/simd_target.h"
#include "core/tensor.h"
#include "ops/bf16_pairs.h"
#include "ops/matmul_bf16.h"
#include "ops/precision.h"

namespace hlm::testing {

// Restores the SIMD target chosen at startup (HLM_SIMD or the CPU's best) when a test that forces others ends.
struct TargetGuard {
  std::string start = simd_target();
  ~TargetGuard() { set_simd_target(start); }
};

inline std::vector<float> nan_vec(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// The bit pattern of a float, and the float of a bit pattern.
inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Each element rounded by ops::to_bf16 (the reference for kernels that write bf16).
inline std::vector<ops::bf16> bf16_rounded(const std::vector<float>& x) {
  std::vector<ops::bf16> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = ops::to_bf16(x[i]);
  return r;
}

// Each bf16 widened to fp32 by ops::from_bf16 (exact).
inline std::vector<float> widened(const std::vector<ops::bf16>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = ops::from_bf16(x[i]);
  return r;
}

inline std::vector<float> randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.normal() * scale);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The same values in another element type (a problem built in double, run in float).
template <typename To, typename From>
std::vector<To> cast(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

// Dense [rows, n_heads * head_width] in double from a strided buffer: row i starts at i * row_stride + offset,
// head h at + h * head_stride (a slot of a fused row such as attention's [q | k | v], or heads with padding).
template <typename V>
std::vector<double> unpack_heads(const V& x, i64 rows, i64 row_stride, i64 offset, i64 n_heads, i64 head_stride,
                                 i64 head_width) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(rows * n_heads * head_width));
  for (i64 i = 0; i < rows; ++i)
    for (i64 h = 0; h < n_heads; ++h)
      for (i64 e = 0; e < head_width; ++e) out.push_back(static_cast<double>(x[i * row_stride + offset + h * head_stride + e]));
  return out;
}
template <typename V>
std::vector<double> unpack_rows(const V& x, i64 rows, i64 row_stride, i64 offset, i64 width) {
  return unpack_heads(x, rows, row_stride, offset, 1, width, width);
}

// doc_start ([B, T]: each token's document start) of packed rows, from each row's document start positions
// (starts[b][0] == 0, increasing).
inline std::vector<int32_t> packed_doc_start(i64 T, const std::vector<std::vector<i64>>& starts) {
  std::vector<int32_t> ds;
  for (const auto& row : starts) {
    size_t k = 0;
    for (i64 t = 0; t < T; ++t) {
      while (k + 1 < row.size() && row[k + 1] <= t) ++k;
      ds.push_back(static_cast<int32_t>(row[k]));
    }
  }
  return ds;
}
// The same from each row's document lengths (each row's lengths sum to T).
inline std::vector<int32_t> doc_start_from_lengths(i64 T, const std::vector<std::vector<i64>>& lengths) {
  std::vector<std::vector<i64>> starts;
  for (const auto& row : lengths) {
    i64 start = 0;
    starts.emplace_back();
    for (i64 len : row) starts.back().push_back(start), start += len;
    EXPECT_EQ(start, T) << "document lengths of a row must sum to T";
  }
  return packed_doc_start(T, starts);
}
// A document start every `period` tokens in each of B rows (the probe's max span, many short documents).
inline std::vector<int32_t> periodic_doc_start(i64 B, i64 T, i64 period) {
  std::vector<int32_t> ds(static_cast<size_t>(B * T));
  for (i64 b = 0; b < B; ++b)
    for (i64 t = 0; t < T; ++t) ds[b * T + t] = static_cast<int32_t>(t - t % period);
  return ds;
}

// Relative RMS error ||a - b|| / max(||b||, tiny). Reports worst index and first values on failure.
template <typename A, typename B>
::testing::AssertionResult close_rel(const A& got, const B& want, double tol, const std::string& what = "") {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  double num = 0, den = 0, worst = -1;
  size_t wi = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = want[i];
    if (!std::isfinite(g)) return ::testing::AssertionFailure() << what << ": non-finite at " << i << " (" << g << ")";
    double d = g - w;
    num += d * d;
    den += w * w;
    if (std::fabs(d) > worst) worst = std::fabs(d), wi = i;
  }
  double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  if (std::getenv("HLM_TEST_PRINT_ERRORS")) std::fprintf(stderr, "close_rel %s: %.3g (tol %.3g, %.2f of it)\n", what.c_str(), rel, tol, rel / tol);
  if (rel <= tol) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure();
  f << what << ": rel RMS error " << rel << " > " << tol << "; worst |diff| " << worst << " at " << wi
    << " (got " << got[wi] << ", want " << want[wi] << "); first values:";
  for (size_t i = 0; i < std::min<size_t>(4, got.size()); ++i) f << " (" << got[i] << " vs " << want[i] << ")";
  return f;
}

// Tolerance of an fp32 kernel against a double reference, from rounding-error analysis (docs/testing.md):
// relative RMS error <= kFp32Lambda * u * sqrt(depth), u = 2^-24 (fp32 unit roundoff). `depth` counts the fp32
// roundings that accumulate into one output along its chain of stages (fp32_depth): each stage's reduction
// length (a dot product or norm over n terms: n; a scan over T tokens: T), 1 per elementwise function, and
// kappa^2 times that where a stage's relative error is amplified by kappa on the way to the output (a gate
// sigmoid(z) that scales the output: kappa = |z|). Two fp32 computations compared with each other: the sum of
// both depths. Gradients: the forward's and the backward's chains plus the longest gradient sum.
constexpr double kFp32UnitRoundoff = 0x1p-24;
constexpr double kFp32Lambda = 4;
inline double fp32_depth(std::initializer_list<double> stages) {
  double depth = 0;
  for (double d : stages) depth += d;
  return depth;
}
inline double fp32_tol(double depth) { return kFp32Lambda * kFp32UnitRoundoff * std::sqrt(depth); }
// The same for bf16 roundings (--precision bf16, docs/precision.md): unit roundoff u_bf = 2^-8, N counting the bf16
// roundings along the chain.
constexpr double kBf16UnitRoundoff = 0x1p-8;
inline double bf16_tol(double depth) { return kFp32Lambda * kBf16UnitRoundoff * std::sqrt(depth); }

// Skips a test of the bf16 kernels (ops/bf16_pairs.h) unless they run here: the CPU has AVX512_BF16, and oneDNN
// has a bf16 matmul, which --precision bf16 needs (ONEDNN_MAX_CPU_ISA=AVX2 takes it away, as on an AVX2-only CPU).
#define SKIP_UNLESS_BF16_KERNELS()                                                                             \
  if (!::hlm::ops::bf16_pairs::available() || !::hlm::ops::bf16_matmul_available())                           \
  GTEST_SKIP() << "the bf16 kernels do not run here (AVX512_BF16 and oneDNN's bf16 matmul needed): they keep " \
                  "fp32 products"

// Runs body once per bf16 product path this CPU has (ops/bf16_pairs.h): AMX tiles where amx_available(), then
// vdpbf16ps blocks; the path is named in failures, and the setting restored after.
template <typename Body>
void for_each_bf16_product_path(Body&& body) {
  const bool before = ::hlm::ops::bf16_pairs::set_amx_allowed(true);
  for (bool amx : {true, false}) {
    if (amx && !::hlm::ops::bf16_pairs::amx_available()) continue;
    SCOPED_TRACE(amx ? "bf16 products on AMX tiles" : "bf16 products on vdpbf16ps blocks");
    ::hlm::ops::bf16_pairs::set_amx_allowed(amx);
    body();
  }
  ::hlm::ops::bf16_pairs::set_amx_allowed(before);
}

// rms(a - b) / rms(b): how far a bf16 run is from the fp32 kernel's (tests check bf16 really ran: > 0.1 u_bf).
template <typename A, typename B>
double rel_rms_diff(const A& a, const B& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d, den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / den);
}

// Central finite difference of a scalar loss w.r.t. x[i] (x is perturbed in place and restored).
template <typename T>
double fd_grad(std::vector<T>& x, size_t i, const std::function<double()>& loss, double eps) {
  T old = x[i];
  x[i] = static_cast<T>(old + eps);
  double lp = loss();
  x[i] = static_cast<T>(old - eps);
  double lm = loss();
  x[i] = old;
  return (lp - lm) / (2 * eps);
}

}  // namespace hlm::testing
