#pragma once
// Test helpers: the one tolerance policy (relative RMS error), NaN-filled outputs (a kernel that
// forgets to write fails loudly), random fills, and central finite differences in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"

namespace hlm::testing {

inline std::vector<float> nan_vec(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

inline std::vector<float> randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.normal() * scale);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

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
  if (rel <= tol) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure();
  f << what << ": rel RMS error " << rel << " > " << tol << "; worst |diff| " << worst << " at " << wi
    << " (got " << got[wi] << ", want " << want[wi] << "); first values:";
  for (size_t i = 0; i < std::min<size_t>(4, got.size()); ++i) f << " (" << got[i] << " vs " << want[i] << ")";
  return f;
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
