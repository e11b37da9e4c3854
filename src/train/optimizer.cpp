#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"

namespace hlm {

AdamW::AdamW(const ParamRegistry& reg, AdamWConfig cfg) : reg_(reg), cfg_(cfg) {
  const size_t n = static_cast<size_t>(reg.total_floats());
  m_.assign(n, 0.f);
  v_.assign(n, 0.f);
  for (const auto& p : reg.all()) spans_.push_back({p.offset, p.offset + p.shape.numel(), p.decay});
}

double AdamW::clip(float* g) const {
  const i64 n = reg_.total_floats();
  // Padding floats between tensors stay zero, so summing the whole buffer is exact.
  double sq = parallel_sum(n, [&](i64 b, i64 e) {
    double s = 0;
    for (i64 i = b; i < e; ++i) s += static_cast<double>(g[i]) * g[i];
    return s;
  });
  double norm = std::sqrt(sq);
  if (cfg_.grad_clip > 0) {
    double coef = cfg_.grad_clip / (norm + 1e-6);
    if (coef < 1.0) {
      const float c = static_cast<float>(coef);
      parallel_for(n, [&](i64 b, i64 e) {
        for (i64 i = b; i < e; ++i) g[i] *= c;
      });
    }
  }
  return norm;
}

void AdamW::step(float* p, const float* g, double lr) {
  ++t_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(cfg_.eps);
  const float decay = static_cast<float>(1.0 - lr * cfg_.weight_decay);
  float* m = m_.data();
  float* v = v_.data();
  parallel_for(reg_.total_floats(), [&](i64 b, i64 e) {
    for (const DecaySpan& s : spans_) {
      const i64 lo = std::max(b, s.begin), hi = std::min(e, s.end);
      if (lo >= hi) continue;
      const float f = s.decay ? decay : 1.f;  // p * 1 == p exactly: the same bits as skipping the decay
#pragma omp simd
      for (i64 i = lo; i < hi; ++i) {
        const float pi = p[i] * f;
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        p[i] = pi - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
      }
    }
  });
}

}  // namespace hlm

namespace hlm {

void AdamW::load_moments(const SafeTensorsFile& f) {
  for (const auto& p : reg_.all()) {
    const float* m = f.get_f32("exp_avg." + p.name, p.shape);
    const float* v = f.get_f32("exp_avg_sq." + p.name, p.shape);
    std::copy(m, m + p.shape.numel(), m_.begin() + p.offset);
    std::copy(v, v + p.shape.numel(), v_.begin() + p.offset);
  }
}

}  // namespace hlm
