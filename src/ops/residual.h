#pragma once
// The residual stream's adds (x += block output) over all threads. A pass over N*D floats is memory-bound, so the
// plain loop the compiler vectorizes is as fast as a dispatched one; run on one thread it left the others idle for
// ~3% of a training step (docs/performance.md).
#include "core/tensor.h"

namespace hlm::ops {

// dst[i] += src[i] for i < n.
void residual_add(float* dst, const float* src, i64 n);

}  // namespace hlm::ops
