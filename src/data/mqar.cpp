#include "data/mqar.h"

#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace hlm::data {

namespace {

std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// k distinct integers from [lo, hi), in random order (partial Fisher-Yates).
void draw_distinct(Rng& r, i64 lo, i64 hi, i64 k, std::vector<int32_t>& pool, int32_t* out) {
  pool.resize(static_cast<size_t>(hi - lo));
  std::iota(pool.begin(), pool.end(), static_cast<int32_t>(lo));
  const i64 n = hi - lo;
  for (i64 i = 0; i < k; ++i) {
    const i64 j = i + static_cast<i64>(r.below(static_cast<std::uint64_t>(n - i)));
    std::swap(pool[i], pool[j]);
    out[i] = pool[i];
  }
}

}  // namespace

MqarGenerator::MqarGenerator(const MqarConfig& cfg, std::uint64_t seed) : cfg_(cfg), seed_(seed) {
  const i64 V = cfg.vocab_size, T = cfg.seq_len, kv = cfg.num_kv_pairs;
  HLM_CHECK(kv >= 1, "mqar: num_kv_pairs must be >= 1 (got {})", kv);
  HLM_CHECK(V / 2 - 1 >= kv && V - V / 2 >= kv,
            "mqar: vocab_size {} is too small for {} key-value pairs (keys come from [1, V/2), values from [V/2, V))",
            V, kv);
  HLM_CHECK(T >= 2 * kv && (T - 2 * kv) / 2 >= kv,
            "mqar: seq_len {} is too short for {} key-value pairs (needs 2*kv context + 2*kv query slots = {})", T, kv,
            4 * kv);
  HLM_CHECK(cfg.power_a > 0, "mqar: power_a must be > 0 (got {})", cfg.power_a);
  const i64 space = (T - 2 * kv) / 2;
  gap_weight_.resize(static_cast<size_t>(space));
  for (i64 g = 0; g < space; ++g) gap_weight_[g] = std::pow(static_cast<double>(g + 1), cfg.power_a - 1.0);
}

void MqarGenerator::example(std::uint64_t index, int32_t* inputs, int32_t* targets) const {
  const i64 V = cfg_.vocab_size, T = cfg_.seq_len, kv = cfg_.num_kv_pairs, half = V / 2;
  Rng r(splitmix64(splitmix64(seed_) ^ index));
  std::vector<int32_t> pool, keys(static_cast<size_t>(kv)), vals(static_cast<size_t>(kv));
  draw_distinct(r, 1, half, kv, pool, keys.data());
  draw_distinct(r, half, V, kv, pool, vals.data());
  // Query slots without replacement, P(g) ~ (g+1)^(a-1), renormalised after each draw.
  std::vector<double> w = gap_weight_;
  std::vector<i64> slot(static_cast<size_t>(kv));
  for (i64 i = 0; i < kv; ++i) {
    double total = 0;
    for (double x : w) total += x;
    double u = r.uniform() * total;
    i64 g = 0;
    const i64 space = static_cast<i64>(w.size());
    for (; g < space - 1; ++g) {
      if (w[g] > 0 && u < w[g]) break;
      u -= w[g];
    }
    while (w[g] == 0) --g;  // rounding at the end of the range: take the last free slot
    slot[i] = g;
    w[g] = 0;
  }
  for (i64 t = 0; t < T; ++t) targets[t] = -1;
  for (i64 i = 0; i < kv; ++i) {
    inputs[2 * i] = keys[i];
    inputs[2 * i + 1] = vals[i];
  }
  for (i64 t = 2 * kv; t < T; ++t)
    inputs[t] = cfg_.random_non_queries ? static_cast<int32_t>(r.below(static_cast<std::uint64_t>(V))) : 0;
  for (i64 i = 0; i < kv; ++i) {
    const i64 pos = 2 * kv + 2 * slot[i];
    inputs[pos] = keys[i];
    targets[pos] = vals[i];
  }
}

void MqarGenerator::next(i64 B, MqarBatch& out) {
  HLM_CHECK(B >= 1, "mqar: batch must be >= 1 (got {})", B);
  const i64 T = cfg_.seq_len;
  out.B = B;
  out.T = T;
  out.inputs.resize(static_cast<size_t>(B * T));
  out.targets.resize(static_cast<size_t>(B * T));
  for (i64 b = 0; b < B; ++b) example(next_++, out.inputs.data() + b * T, out.targets.data() + b * T);
}

double mqar_accuracy(const float* logits, const int32_t* targets, i64 N, i64 V) {
  i64 n = 0, hit = 0;
  for (i64 i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    const float* row = logits + i * V;
    i64 best = 0;
    for (i64 v = 1; v < V; ++v)
      if (row[v] > row[best]) best = v;
    ++n;
    hit += best == targets[i];
  }
  return n ? static_cast<double>(hit) / static_cast<double>(n) : 0.0;
}

double mqar_accuracy_from_predictions(const int32_t* predicted, const int32_t* targets, i64 N) {
  i64 n = 0, hit = 0;
  for (i64 i = 0; i < N; ++i) {
    if (targets[i] < 0) continue;
    ++n;
    hit += predicted[i] == targets[i];
  }
  return n ? static_cast<double>(hit) / static_cast<double>(n) : 0.0;
}

}  // namespace hlm::data
