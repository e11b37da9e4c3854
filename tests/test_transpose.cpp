// The transposing passes of the bf16 weight gradient (ops/transpose.h) against element-wise references, on every
// SIMD target this CPU runs (the AVX-512 tiles run only under an AVX3 target) and the portable fallback.
#include "ops/transpose.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "core/simd_target.h"
#include "testing.h"

using namespace hlm;
using namespace hlm::testing;

namespace {

std::vector<std::string> every_target() {
  std::vector<std::string> t = simd_targets_available();
  t.push_back("fallback");
  return t;
}

// Shapes (rows, cols, ld): one element, tails in both directions (an odd row count ends a pair strip half-full),
// exact tiles, and one large enough to run in parallel (rows x cols >= 2^16) with row blocks that do not divide it.
struct TileShape {
  i64 rows, cols, ld;
};
const TileShape kShapes[] = {{1, 1, 1},    {3, 5, 7},     {37, 53, 60},    {32, 16, 16},
                              {64, 48, 48}, {129, 33, 40}, {333, 260, 261}};

// Random values of every magnitude, with the values to_bf16 treats specially planted among them.
std::vector<float> tricky_values(i64 n, std::uint64_t seed) {
  std::vector<float> v = randn(static_cast<size_t>(n), seed);
  Rng r(seed + 1);
  for (auto& x : v) x *= static_cast<float>(std::exp(r.normal() * 8));
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                           bits_float(0x7f800001u) /* signalling NaN, top half inf */, bits_float(0xff80ffffu),
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           bits_float(0x7f7fffffu) /* rounds up to inf */, bits_float(0x00000001u) /* denormal */,
                           bits_float(0x807fffffu), 0.f, -0.f, bits_float(0x3f808000u) /* tie: down */,
                           bits_float(0x3f818000u) /* tie: up */, bits_float(0x3f808001u)};
  for (size_t i = 0; i < std::size(special) && i < v.size(); ++i) v[(i * 7919) % v.size()] = special[i];
  return v;
}

}  // namespace

TEST(Transpose, RoundToBf16TransposedGivesTheBitsOfToBf16OnEveryTarget) {
  const TargetGuard guard;
  for (const std::string& target : every_target()) {
    set_simd_target(target);
    for (const TileShape& s : kShapes) {
      const auto src = tricky_values(s.rows * s.ld, 11 + s.rows);
      std::vector<ops::bf16> dst(static_cast<size_t>(s.rows * s.cols), 0xdead);
      ops::round_to_bf16_transposed(src.data(), s.rows, s.cols, s.ld, dst.data());
      for (i64 r = 0; r < s.rows; ++r)
        for (i64 c = 0; c < s.cols; ++c)
          ASSERT_EQ(dst[c * s.rows + r], ops::to_bf16(src[r * s.ld + c]))
              << target << " rows " << s.rows << " cols " << s.cols << " at (" << r << ", " << c << ")";
    }
  }
}

TEST(Transpose, AddTransposedAddsEachElementOnceOnEveryTarget) {
  const TargetGuard guard;
  for (const std::string& target : every_target()) {
    set_simd_target(target);
    for (const TileShape& s : kShapes) {
      const auto src = randn(static_cast<size_t>(s.rows * s.cols), 21 + s.cols);
      const auto start = randn(static_cast<size_t>(s.rows * s.cols), 22 + s.cols);
      std::vector<float> dst = start;
      ops::add_transposed(src.data(), s.rows, s.cols, dst.data());
      for (i64 r = 0; r < s.rows; ++r)
        for (i64 c = 0; c < s.cols; ++c)
          ASSERT_EQ(dst[c * s.rows + r], start[c * s.rows + r] + src[r * s.cols + c])
              << target << " rows " << s.rows << " cols " << s.cols << " at (" << r << ", " << c << ")";
    }
  }
}

TEST(Transpose, EmptyShapesWriteNothing) {
  std::vector<ops::bf16> b(4, 7);
  std::vector<float> f(4, 1.f);
  ops::round_to_bf16_transposed(nullptr, 0, 4, 4, b.data());
  ops::add_transposed(nullptr, 4, 0, f.data());
  EXPECT_EQ(b, std::vector<ops::bf16>(4, 7));
  EXPECT_EQ(f, std::vector<float>(4, 1.f));
}
