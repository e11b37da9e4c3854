#include "ops/add.h"

#include "core/parallel.h"

namespace hlm::ops {

void add_into(float* dst, const float* src, i64 n) {
  // 16K floats a thread at least: below that the parallel region costs more than the pass.
  parallel_for(n, [&](i64 b, i64 e) {
#pragma omp simd
    for (i64 i = b; i < e; ++i) dst[i] += src[i];
  }, i64{1} << 14);
}

}  // namespace hlm::ops
