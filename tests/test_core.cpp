#include <gtest/gtest.h>

#include <set>

#include "core/arena.h"
#include "core/parallel.h"
#include "core/rng.h"

using namespace hlm;

TEST(Rng, SameSeedSameStreamAndStateRoundTrip) {
  Rng a(42), b(42);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  auto st = a.state();
  double x = a.normal();
  Rng c(0);
  c.set_state(st);
  EXPECT_EQ(c.normal(), x);
}

TEST(Rng, NormalMomentsAreStandard) {
  Rng r(7);
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = r.normal();
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
}

TEST(Arena, AlignedBumpAllocationAndOverflowError) {
  Arena a(1 << 12);
  float* p = a.floats(3);
  float* q = a.floats(5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % 64, 0u);
  EXPECT_EQ(q - p, 16);
  EXPECT_THROW(a.floats(1 << 12, "big"), Error);
  a.reset();
  EXPECT_EQ(a.floats(1), p);
}

TEST(Parallel, StaticPartitionCoversEachIndexOnceAndSumIsDeterministic) {
  std::vector<int> hits(1000, 0);
  parallel_for(1000, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) EXPECT_EQ(h, 1);
  auto f = [](i64 b, i64 e) {
    double s = 0;
    for (i64 i = b; i < e; ++i) s += 1.0 / (1 + i);
    return s;
  };
  EXPECT_EQ(parallel_sum(100000, f), parallel_sum(100000, f));
}
