#include "train/data_parallel.h"

#include <string_view>

#include "core/error.h"
#include "data/corpus.h"
#include "train/distributed.h"

namespace hlm {

BatchSplit split_global_batch(i64 global_batch, int world, i64 batch) {
  HLM_CHECK(world >= 1 && batch >= 1 && global_batch >= 1, "split_global_batch: global {} world {} batch {}",
            global_batch, world, batch);
  if (global_batch % world != 0)
    fail("the global batch of {} rows does not split evenly over {} ranks; run on a number of ranks that divides {}",
         global_batch, world, global_batch);
  const i64 rows = global_batch / world;
  i64 b = std::min(batch, rows);
  while (rows % b != 0) --b;
  return {b, static_cast<int>(rows / b)};
}

std::uint64_t checksum(const float* data, i64 n) {
  return data::hash64(std::string_view(reinterpret_cast<const char*>(data), static_cast<size_t>(n) * sizeof(float)),
                      0xd15cULL);
}

void check_replicas_identical(const float* params, i64 n, long step) {
  if (dist::world_size() == 1) return;
  if (!dist::all_equal(checksum(params, n)))
    fail("the weights differ between ranks at step {} (checksums disagree): the replicas drifted apart, which "
         "means a rank computed something different (e.g. ranks run different builds or --threads); stopped "
         "without saving",
         step);
}

}  // namespace hlm
