#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace hlm::ops {

// out[N,D] = table[tokens[n], :]. Throws hlm::Error on a token id outside [0, V).
void embedding_forward(const int32_t* tokens, const float* table, float* out, i64 N, i64 D, i64 V);
// dtable[V,D] += scatter of dout[N,D] (deterministic: rows are summed in token order).
void embedding_backward(const int32_t* tokens, const float* dout, float* dtable, i64 N, i64 D, i64 V);

}  // namespace hlm::ops
