#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace hlm::ops {

// out[N,D] = table[tokens[n], :] * scale (scale 1: the rows copied). Throws hlm::Error on a token id outside [0, V).
void embedding_forward(const int32_t* tokens, const float* table, float* out, i64 N, i64 D, i64 V,
                       float scale = 1.f);
// dtable[V,D] += scatter of dout[N,D] * scale (deterministic: each row is summed in token order, no atomics, so
// the result is bit-identical for any thread count).
void embedding_backward(const int32_t* tokens, const float* dout, float* dtable, i64 N, i64 D, i64 V,
                        float scale = 1.f);

}  // namespace hlm::ops
