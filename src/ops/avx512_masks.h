#pragma once
// Lane masks for the AVX-512 intrinsic kernels (x86-64 only; callers compiled with a target attribute that includes
// avx512f, see ops/transpose16.h).
#if defined(__x86_64__)
#include <immintrin.h>

#include "core/tensor.h"

namespace hlm::ops {

// The first n of 16 lanes (none for n <= 0, all for n >= 16).
__attribute__((target("avx512f"))) inline __mmask16 first_lanes(i64 n) {
  return static_cast<__mmask16>(n >= 16 ? 0xFFFFu : n <= 0 ? 0u : (1u << n) - 1u);
}

}  // namespace hlm::ops
#endif
