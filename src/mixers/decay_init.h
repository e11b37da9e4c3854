#pragma once
// The per-head decay init that Mamba-2 and Gated DeltaNet share (mamba_ssm, fla): A ~ U[lo, hi] stored as
// A_log = ln A, and dt log-uniform in [lo, hi] stored as dt_bias = softplus^-1(dt), both floored at 1e-4 (A so
// that ln A stays finite when the range starts at 0). The ranges are layer_types.{M,G}.a_init_range /
// dt_init_range (docs/model.md). One draw per head, in head order.
#include <algorithm>
#include <array>
#include <cmath>

#include "core/rng.h"
#include "core/tensor.h"

namespace hlm {

inline void init_a_log(Rng& rng, const std::array<double, 2>& range, float* a_log, i64 heads) {
  for (i64 h = 0; h < heads; ++h)
    a_log[h] = static_cast<float>(std::log(std::max(rng.uniform(range[0], range[1]), 1e-4)));
}

inline void init_dt_bias(Rng& rng, const std::array<double, 2>& range, float* dt_bias, i64 heads) {
  for (i64 h = 0; h < heads; ++h) {
    const double dt = std::max(std::exp(rng.uniform(std::log(range[0]), std::log(range[1]))), 1e-4);
    dt_bias[h] = static_cast<float>(dt + std::log(-std::expm1(-dt)));
  }
}

}  // namespace hlm
