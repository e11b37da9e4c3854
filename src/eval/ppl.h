#pragma once
// Loss on a token shard at one sequence length, overall and by position bucket (sequential windows).
#include <vector>

#include "data/shard.h"
#include "model/model.h"

namespace hlm {

struct PositionLoss {
  i64 seq_len = 0, tokens = 0;
  double loss = 0;
  std::vector<i64> bucket_start, bucket_end;
  std::vector<double> bucket_loss;  // NaN where empty
  std::vector<i64> bucket_tokens;
};

// Sequential, non-overlapping windows of seq_len (+1) tokens, rows per batch = tokens_per_batch / seq_len,
// until max_tokens targets. `progress` prints a line on stderr.
PositionLoss loss_by_position(Model& model, std::shared_ptr<const data::TokenShard> shard, i64 seq_len, int buckets,
                              i64 tokens_per_batch, i64 max_tokens, bool progress);

}  // namespace hlm
