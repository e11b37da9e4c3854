#pragma once
// Data parallelism over the ranks of train/distributed.h (docs/distributed.md): how a global batch is
// split across ranks, and the check that every rank still holds the same weights.
//
// A global batch is G = world_size x batch x grad_accum rows, taken from the data stream by global
// sample index (data/loader.h): micro-batch m of rank r holds the rows
// [m * world * batch + r * batch, + batch) of the step's G, so the set of rows of a step, and the data
// order, do not depend on how G is split.
#include <cstdint>

#include "core/tensor.h"

namespace hlm {

struct BatchSplit {
  i64 batch = 1;       // rows per micro-batch on one rank
  int grad_accum = 1;  // micro-batches per optimizer step
};

// The split of `global_batch` rows over `world` ranks closest to the wanted micro-batch `batch`: keeps
// `batch` when it divides the rows per rank (grad_accum = rows / batch), else the largest divisor of the
// rows per rank below it. hlm::Error when `world` does not divide `global_batch`.
BatchSplit split_global_batch(i64 global_batch, int world, i64 batch);

// 64-bit hash of a float buffer's bytes (identical weights <=> identical hash, up to collisions).
std::uint64_t checksum(const float* data, i64 n);

// Compares the weights' checksum across ranks; hlm::Error naming the step when they differ.
void check_replicas_identical(const float* params, i64 n, long step);

}  // namespace hlm
