#pragma once
// Next-token sampling from logits: greedy (temperature 0), temperature, top-k, top-p (nucleus), seeded.
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace hlm {

struct SamplerConfig {
  double temperature = 0.0;  // 0 = greedy (argmax)
  int top_k = 0;             // 0 = off
  double top_p = 1.0;        // 1 = off
  std::uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplerConfig c) : cfg_(c), rng_(c.seed) {}
  // logits[V] -> token id. Deterministic for a given seed and call sequence.
  int32_t sample(const float* logits, i64 V);

 private:
  SamplerConfig cfg_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> buf_;
};

int32_t argmax(const float* x, i64 n);

}  // namespace hlm
