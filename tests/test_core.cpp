#include <gtest/gtest.h>

#include <set>

#include "core/arena.h"
#include "core/arena_count.h"
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

// The counting dry run takes, for any sequence of allocations, marks and releases, exactly the bytes the arena
// takes (64-byte rounding included) and the same peak.
template <class Alloc>
void allocation_sequence(Alloc& a) {
  a.floats(3);
  const auto m = a.mark();
  a.ints(17);
  a.floats(16);
  a.floats(1000);
  a.release_to(m);
  a.ints(1);
  a.floats(0);
  a.floats(33);
}

TEST(Arena, CountingDryRunTakesExactlyWhatTheArenaTakes) {
  Arena a(1 << 16);
  ArenaCount c;
  allocation_sequence(a);
  allocation_sequence(c);
  EXPECT_EQ(c.used(), a.used());
  EXPECT_EQ(c.high_water(), a.high_water());
  EXPECT_EQ(c.used(), 64u * (1 + 1 + 0 + 3));            // 3 floats, 1 int, 0 floats, 33 floats
  EXPECT_EQ(c.high_water(), 64u * (1 + 2 + 1 + 63));     // 3 floats, 17 ints, 16 floats, 1000 floats
  EXPECT_EQ(c.used_floats(), static_cast<i64>(c.used() / 4));
  EXPECT_EQ(count_floats(allocation_sequence<ArenaCount>).peak, c.high_water_floats());
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
