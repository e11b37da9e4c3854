#include "infer/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace hlm {

int32_t argmax(const float* x, i64 n) {
  i64 best = 0;
  for (i64 i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

int32_t Sampler::sample(const float* logits, i64 V) {
  if (cfg_.temperature <= 0) return argmax(logits, V);
  HLM_CHECK(cfg_.top_p > 0 && cfg_.top_p <= 1, "sampler: top_p must be in (0, 1], got {}", cfg_.top_p);
  buf_.resize(static_cast<size_t>(V));
  for (i64 i = 0; i < V; ++i) buf_[i] = {logits[i] / static_cast<float>(cfg_.temperature), static_cast<int32_t>(i)};
  // Descending by logit; ties by id so the order (and the draw) is deterministic.
  auto cmp = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  i64 keep = V;
  if (cfg_.top_k > 0 && cfg_.top_k < V) {
    keep = cfg_.top_k;
    std::partial_sort(buf_.begin(), buf_.begin() + keep, buf_.end(), cmp);
  } else {
    std::sort(buf_.begin(), buf_.end(), cmp);
  }
  const float mx = buf_[0].first;
  double total = 0;
  std::vector<double> p(static_cast<size_t>(keep));
  for (i64 i = 0; i < keep; ++i) total += (p[i] = std::exp(static_cast<double>(buf_[i].first - mx)));
  if (cfg_.top_p < 1.0) {
    double cum = 0;
    i64 cut = keep;
    for (i64 i = 0; i < keep; ++i) {
      cum += p[i] / total;
      if (cum >= cfg_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = 0;
    for (i64 i = 0; i < keep; ++i) total += p[i];
  }
  double u = rng_.uniform() * total, acc = 0;
  for (i64 i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return buf_[i].second;
  }
  return buf_[keep - 1].second;
}

}  // namespace hlm
