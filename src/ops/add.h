#pragma once
// dst += src over all threads: the residual stream's adds (x += block output) and the fused LM head's partial sums.
// A pass over many floats is memory-bound, so the plain loop the compiler vectorizes is as fast as a dispatched one.
// Run on one thread, a block's residual adds left the other threads idle for 3-5% of a training step
// (docs/performance.md "Off the main thread"); its other adds are folded into RMSNorm's passes (ops/rmsnorm.h).
#include "core/tensor.h"

namespace hlm::ops {

// dst[i] += src[i] for i < n.
void add_into(float* dst, const float* src, i64 n);

}  // namespace hlm::ops
