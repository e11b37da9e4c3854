#pragma once
// Deterministic batches from a token shard. Each row is a window of T+1 consecutive tokens: inputs are
// the first T, targets the last T (next-token prediction), doc_start marks packed-document boundaries
// (docs/conventions.md): doc_start[b*T+t] = index within row b of the first token of t's document,
// where a document starts right after an <eos>.
//
// Random mode: the shard is cut into N windows of stride T (at a per-epoch random offset in [0, T));
// each epoch visits all N in a seeded random order, so one epoch covers the data once. The global batch
// stream is [B * world_size] windows per step; rank r takes the r-th slice of B, so ranks are disjoint.
// The whole position is LoaderState {seed, epoch, cursor}: the order of epoch e is a pure function of
// (seed, e), so saving and restoring the state continues the identical stream.
//
// Sequential mode (evaluation): non-overlapping windows at 0, T, 2T, ... in order, one pass.
#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/shard.h"

namespace hlm::data {

enum class SampleMode { kRandom, kSequential };

struct LoaderState {
  SampleMode mode = SampleMode::kRandom;
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;   // completed passes over the shard (random mode)
  std::uint64_t cursor = 0;  // next global window within the epoch, counting every rank's rows
  std::int64_t seq_len = 0;             // checked on restore
  std::int64_t windows_per_epoch = 0;   // checked on restore (a different shard or T would not resume)

  nlohmann::json to_json() const;
  // Throws hlm::Error naming the missing or malformed field.
  static LoaderState from_json(const nlohmann::json& j);
  bool operator==(const LoaderState&) const = default;
};

struct LoaderOptions {
  int batch = 1;        // B: rows per rank
  int seq_len = 0;      // T
  std::uint64_t seed = 0;
  SampleMode mode = SampleMode::kRandom;
  int rank = 0;
  int world_size = 1;
};

struct Batch {
  int B = 0, T = 0;
  int rows = 0;  // rows holding data (B, except in the last sequential batch; padding rows have targets -1)
  std::vector<std::int32_t> inputs;     // [B, T]
  std::vector<std::int32_t> targets;    // [B, T]
  std::vector<std::int32_t> doc_start;  // [B, T]
};

class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<const TokenShard> shard, const LoaderOptions& opt);

  // Fills `out` with this rank's next rows. Random mode always returns true. Sequential mode returns
  // false once every window was served; a rank may get rows == 0 in the last step while others still
  // have data, so all ranks call next() the same number of times.
  bool next(Batch& out);

  LoaderState state() const { return state_; }
  // Continues exactly where `s` was taken (throws hlm::Error if it belongs to another shard, T or mode).
  void restore(const LoaderState& s);
  // Back to the start of the stream (sequential evaluation passes).
  void reset();

  std::int64_t windows_per_epoch() const { return n_windows_; }
  // Global steps (B * world_size windows each) per epoch, rounded down.
  std::int64_t steps_per_epoch() const { return n_windows_ / (std::int64_t{opt_.batch} * opt_.world_size); }
  const LoaderOptions& options() const { return opt_; }
  const TokenShard& shard() const { return *shard_; }

 private:
  struct EpochOrder {
    std::uint64_t epoch = ~0ULL;
    std::int64_t offset = 0;
    std::vector<std::uint32_t> perm;
  };
  const EpochOrder& order_for(std::uint64_t epoch);
  void fill_row(std::int64_t start, int row, Batch& out) const;

  std::shared_ptr<const TokenShard> shard_;
  LoaderOptions opt_;
  LoaderState state_;
  std::int64_t n_windows_ = 0;
  bool random_offset_ = false;
  EpochOrder cache_[2];
};

}  // namespace hlm::data
