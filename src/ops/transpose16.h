#pragma once
// In-register transpose of a 16 x 16 block of 32-bit elements with AVX-512 (x86-64 only): the attention kernels' tile
// packing (ops/attention.cpp, ops/bf16_pairs.cpp). Highway 1.0 has no 16-lane transpose. Callers are compiled
// for AVX-512 (a Highway AVX3 target or a target attribute) and run only where the CPU has it.
#if defined(__x86_64__)
#include <immintrin.h>

namespace hlm::ops {

// a[i] = row i on entry, column i on exit.
__attribute__((target("avx512f"))) inline void transpose16(__m512 a[16]) {
  __m512 b[16], c[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    b[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);
    b[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    c[4 * i] = _mm512_shuffle_ps(b[4 * i], b[4 * i + 2], 0x44);
    c[4 * i + 1] = _mm512_shuffle_ps(b[4 * i], b[4 * i + 2], 0xEE);
    c[4 * i + 2] = _mm512_shuffle_ps(b[4 * i + 1], b[4 * i + 3], 0x44);
    c[4 * i + 3] = _mm512_shuffle_ps(b[4 * i + 1], b[4 * i + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512 e = _mm512_shuffle_f32x4(c[j], c[4 + j], 0x44), f = _mm512_shuffle_f32x4(c[j], c[4 + j], 0xEE);
    const __m512 g = _mm512_shuffle_f32x4(c[8 + j], c[12 + j], 0x44);
    const __m512 h = _mm512_shuffle_f32x4(c[8 + j], c[12 + j], 0xEE);
    a[j] = _mm512_shuffle_f32x4(e, g, 0x88);
    a[4 + j] = _mm512_shuffle_f32x4(e, g, 0xDD);
    a[8 + j] = _mm512_shuffle_f32x4(f, h, 0x88);
    a[12 + j] = _mm512_shuffle_f32x4(f, h, 0xDD);
  }
}

}  // namespace hlm::ops
#endif
