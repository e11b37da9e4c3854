#pragma once
// A branch-free scalar expf that GCC/Clang vectorise inside `#pragma omp simd` loops (glibc's expf only has
// SIMD variants under -ffast-math). exp(x) = 2^n * e^r with n = round(x / ln 2), |r| <= ln2/2, e^r by a
// degree-7 Taylor polynomial (truncation < 1e-8 relative). Max error about 2 ulp on [-87, 88];
// returns 0 below -87.3 (where expf is subnormal) and saturates above 88.37 (callers here only pass x <= 0).
#include <bit>
#include <cstdint>

namespace hlm::ops {

#pragma omp declare simd
inline float expf_simd(float x) {
  const float lo = -87.3f, hi = 88.37f;  // hi keeps n <= 127
  float xc = x < lo ? lo : (x > hi ? hi : x);
  // Round to nearest via the 1.5 * 2^23 trick (no libm call, vectorises).
  const float magic = 12582912.f;
  float n = (xc * 1.44269504088896341f + magic) - magic;
  // Cody-Waite split of ln 2 keeps r exact enough.
  float r = xc - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723212e-6f;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  int32_t e = static_cast<int32_t>(n) + 127;
  float scale = std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
  return x < lo ? 0.f : p * scale;
}

}  // namespace hlm::ops
