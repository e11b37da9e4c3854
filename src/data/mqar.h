#pragma once
// MQAR, multi-query associative recall (Arora et al., zoology `multiquery_ar`; docs/algorithms.md §10):
// a row is num_kv_pairs key-value pairs "k1 v1 k2 v2 ..." followed by a query region in which every key
// appears once more; the next-token target at that position is the key's value, every other target is -1
// (ignored by the loss). Keys come from [1, V/2), values from [V/2, V), drawn without repetition inside a
// row. Key i re-appears at query-region offset 2 g_i, the slots g (0 <= g < (T - 2 kv) / 2) drawn without
// replacement with P(g) proportional to (g + 1)^(power_a - 1) (power_a = 0.01: mostly short gaps). Other
// query-region tokens are uniform random tokens (zoology's random_non_queries) or 0.
//
// Deterministic by seed: example i of the stream is a pure function of (seed, i), so a stream's position is
// one counter (exact resume) and two generators with one seed give the same batches.
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace hlm::data {

struct MqarConfig {
  i64 vocab_size = 256;  // V: keys [1, V/2), values [V/2, V)
  i64 seq_len = 64;      // T (inputs and targets per row)
  i64 num_kv_pairs = 8;
  double power_a = 0.01;
  bool random_non_queries = true;
};

struct MqarBatch {
  i64 B = 0, T = 0;
  std::vector<int32_t> inputs;   // [B, T]
  std::vector<int32_t> targets;  // [B, T]; -1 except at query positions
};

class MqarGenerator {
 public:
  // Throws hlm::Error naming the field when the config cannot hold the pairs (vocab or length too small).
  MqarGenerator(const MqarConfig& cfg, std::uint64_t seed);
  const MqarConfig& config() const { return cfg_; }

  // Example `index` into row pointers (T each).
  void example(std::uint64_t index, int32_t* inputs, int32_t* targets) const;
  // The next B examples of the stream.
  void next(i64 B, MqarBatch& out);
  std::uint64_t position() const { return next_; }
  void set_position(std::uint64_t p) { next_ = p; }

 private:
  MqarConfig cfg_;
  std::uint64_t seed_;
  std::uint64_t next_ = 0;
  std::vector<double> gap_weight_;  // (g + 1)^(power_a - 1)
};

// Fraction of positions with target >= 0 whose argmax over logits [N, V] equals the target (0 if none).
double mqar_accuracy(const float* logits, const int32_t* targets, i64 N, i64 V);
// Same from predicted tokens [N].
double mqar_accuracy_from_predictions(const int32_t* predicted, const int32_t* targets, i64 N);

}  // namespace hlm::data
