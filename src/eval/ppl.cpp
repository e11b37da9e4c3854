#include "eval/ppl.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "data/loader.h"

namespace hlm {

PositionLoss loss_by_position(Model& model, std::shared_ptr<const data::TokenShard> shard, i64 L, int buckets,
                              i64 tokens_per_batch, i64 max_tokens, bool progress) {
  if (L < 2) fail("loss by position: length {} is too short", L);
  if (L > shard->n_tokens() - 1)
    fail("{}: only {} tokens, fewer than length {}", shard->path(), shard->n_tokens(), L);
  data::LoaderOptions lo;
  // No more rows than max_tokens needs (each row scores at most L targets).
  lo.batch = static_cast<int>(std::max<i64>(1, std::min(tokens_per_batch / L, (max_tokens + L - 1) / L)));
  lo.seq_len = static_cast<int>(L);
  lo.mode = data::SampleMode::kSequential;
  data::BatchLoader loader(shard, lo);
  data::Batch b;
  const int nb = std::max(1, buckets);
  std::vector<double> bsum(nb, 0.0);
  std::vector<i64> bcnt(nb, 0);
  std::vector<float> tl;
  double sum = 0;
  i64 count = 0;
  while (count < max_tokens && loader.next(b)) {
    if (b.rows == 0) break;
    // Score exactly max_tokens targets: those past the budget in this batch are masked out.
    i64 left = max_tokens - count;
    for (auto& t : b.targets)
      if (t >= 0 && left-- <= 0) t = -1;
    tl.resize(static_cast<size_t>(b.B) * b.T);
    i64 n = 0;
    sum += model.forward(b.inputs.data(), b.targets.data(), b.doc_start.data(), b.B, b.T, &n, tl.data());
    count += n;
    for (i64 r = 0; r < b.B; ++r)
      for (i64 t = 0; t < b.T; ++t)
        if (b.targets[r * b.T + t] >= 0) {
          const int k = static_cast<int>(t * nb / b.T);
          bsum[k] += tl[r * b.T + t];
          bcnt[k] += 1;
        }
    if (progress)
      fmt::print(stderr, "\r\033[Kloss: length {} | {} tokens | loss {:.4f}", L, count, sum / std::max<i64>(1, count));
  }
  if (progress) fmt::print(stderr, "\n");
  if (count == 0) fail("{}: no tokens for length {}", shard->path(), L);
  PositionLoss r;
  r.seq_len = L;
  r.tokens = count;
  r.loss = sum / static_cast<double>(count);
  for (int k = 0; k < nb; ++k) {
    r.bucket_start.push_back(L * k / nb);
    r.bucket_end.push_back(L * (k + 1) / nb);
    r.bucket_loss.push_back(bcnt[k] ? bsum[k] / static_cast<double>(bcnt[k]) : NAN);
    r.bucket_tokens.push_back(bcnt[k]);
  }
  return r;
}

}  // namespace hlm
