#include "mixers/mixer.h"

#include <vector>

namespace hlm {

void Mixer::prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) {
  // Row layout is [B, T, D]; step() takes one token of every row at a time.
  const i64 D = d_model_;
  std::vector<float> xt(static_cast<size_t>(B * D)), yt(static_cast<size_t>(B * D));
  for (i64 t = 0; t < T; ++t) {
    for (i64 b = 0; b < B; ++b)
      std::copy(x + (b * T + t) * D, x + (b * T + t + 1) * D, xt.begin() + b * D);
    step(xt.data(), yt.data(), state, B);
    for (i64 b = 0; b < B; ++b) std::copy(yt.begin() + b * D, yt.begin() + (b + 1) * D, y + (b * T + t) * D);
  }
}

}  // namespace hlm
