#include "ops/residual.h"

#include "core/parallel.h"

namespace hlm::ops {

void residual_add(float* dst, const float* src, i64 n) {
  // 16K floats a thread at least: below that the parallel region costs more than the pass.
  parallel_for(n, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) dst[i] += src[i];
  }, i64{1} << 14);
}

}  // namespace hlm::ops
