#include "ops/embedding.h"

#include <cstring>

#include "core/error.h"
#include "core/parallel.h"

namespace hlm::ops {

namespace {
// Checked before any parallel region (an exception must not escape an OpenMP region).
void check_tokens(const char* op, const int32_t* tokens, i64 N, i64 D, i64 V) {
  HLM_CHECK(N >= 0 && D > 0 && V > 0, "{}: bad shape tokens[{}] table[{}, {}]", op, N, V, D);
  for (i64 n = 0; n < N; ++n)
    HLM_CHECK(tokens[n] >= 0 && tokens[n] < V, "{}: token id {} at position {} outside [0, {}) (tokens[{}], table[{}, {}])",
              op, tokens[n], n, V, N, V, D);
}
}  // namespace

void embedding_forward(const int32_t* tokens, const float* table, float* out, i64 N, i64 D, i64 V, float scale) {
  check_tokens("embedding_forward", tokens, N, D, V);
  // out[N,D] = table[V,D][tokens] * scale
  parallel_for(N, [&](i64 b, i64 e) {
    for (i64 n = b; n < e; ++n) {
      const float* src = table + tokens[n] * D;  // [D]
      float* dst = out + n * D;                 // [D]
      if (scale == 1.f) {
        std::memcpy(dst, src, sizeof(float) * D);
        continue;
      }
#pragma omp simd
      for (i64 d = 0; d < D; ++d) dst[d] = src[d] * scale;
    }
  }, 64);
}

void embedding_backward(const int32_t* tokens, const float* dout, float* dtable, i64 N, i64 D, i64 V, float scale) {
  check_tokens("embedding_backward", tokens, N, D, V);
  // Each thread owns a contiguous range of vocab rows and scans all tokens in order, so every dtable row
  // is summed in token order whatever the thread count (bit-identical results), with no atomics.
  // Scanning N ids per thread is cheap next to the D-wide row adds.
  parallel_for(V, [&](i64 vb, i64 ve) {
    for (i64 n = 0; n < N; ++n) {
      const i64 v = tokens[n];
      if (v < vb || v >= ve) continue;
      float* dst = dtable + v * D;       // [D]
      const float* src = dout + n * D;  // [D]
#pragma omp simd
      for (i64 d = 0; d < D; ++d) dst[d] += src[d] * scale;  // scale 1: the plain sum (the product is exact)
    }
  }, 16);
}

}  // namespace hlm::ops
