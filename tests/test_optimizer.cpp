// AdamW against a plain double-precision transcription of torch.optim.AdamW (decoupled weight decay), on a registry
// mixing tensors with and without decay, fused neighbours and the padding between tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/params.h"
#include "core/rng.h"
#include "train/optimizer.h"

namespace hlm {
namespace {

TEST(AdamW, FollowsTheTorchUpdateWithDecayOnlyWhereTheTensorHasIt) {
  ParamRegistry reg;
  reg.add("a", {5, 3});                                     // decay
  reg.add("b", {7}, Init::Ones, 0, 0, false);               // no decay (a norm weight), after padding
  reg.add("c", {2, 4}, Init::Normal, 0.02, 0, true, true);  // decay, fused right after b
  reg.add("d", {9}, Init::Ones, 0, 0, false);               // no decay, last
  const i64 n = reg.total_floats();
  ASSERT_GT(n, reg.count());  // there is padding to leave alone

  AdamWConfig cfg;
  cfg.weight_decay = 0.3;  // large, so a decay applied where it should not be shows
  AdamW opt(reg, cfg);
  std::vector<float> p(n, 0.f), g(n, 0.f);
  std::vector<char> inside(n, 0), decays(n, 0);
  Rng r(7);
  for (const auto& t : reg.all())
    for (i64 i = t.offset; i < t.offset + t.shape.numel(); ++i) {
      p[i] = static_cast<float>(r.normal());
      inside[i] = 1;
      decays[i] = t.decay;
    }
  std::vector<double> pd(p.begin(), p.end()), m(n, 0.0), v(n, 0.0);

  const double lrs[] = {1e-2, 5e-3, 2e-3};
  for (int s = 0; s < 3; ++s) {
    for (i64 i = 0; i < n; ++i) g[i] = inside[i] ? static_cast<float>(r.normal()) : 0.f;
    opt.step(p.data(), g.data(), lrs[s]);
    const double bc1 = 1 - std::pow(cfg.beta1, s + 1), bc2 = 1 - std::pow(cfg.beta2, s + 1);
    for (i64 i = 0; i < n; ++i) {
      if (decays[i]) pd[i] *= 1 - lrs[s] * cfg.weight_decay;
      m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * g[i];
      v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * static_cast<double>(g[i]) * g[i];
      pd[i] -= lrs[s] / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + cfg.eps);
    }
  }
  for (i64 i = 0; i < n; ++i) {
    if (!inside[i]) {
      EXPECT_EQ(p[i], 0.f) << "padding float " << i << " changed";
      continue;
    }
    // A few float roundings per step on values of order 1: well inside 1e-5.
    EXPECT_NEAR(p[i], pd[i], 1e-5) << "float " << i << (decays[i] ? " (decay)" : " (no decay)");
  }
  // With zero gradients, a step moves only the decayed tensors' values (the moments decay to ~0 updates otherwise).
  const std::vector<float> before = p;
  std::fill(g.begin(), g.end(), 0.f);
  AdamW fresh(reg, cfg);
  fresh.step(p.data(), g.data(), 0.1);
  for (i64 i = 0; i < n; ++i) {
    if (decays[i])
      EXPECT_FLOAT_EQ(p[i], before[i] * static_cast<float>(1 - 0.1 * cfg.weight_decay)) << i;
    else
      EXPECT_EQ(p[i], before[i]) << i;
  }
}

}  // namespace
}  // namespace hlm
