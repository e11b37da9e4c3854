#pragma once
// A dry run of Arena (core/arena.h): the same calls, the same 64-byte rounding, mark / release and high water,
// but no memory: every pointer it hands out is nullptr. A mixer lists each phase's arena buffers once, in a
// function templated on the allocator; forward, backward and prefill call it with the step's Arena, and
// the mixer's stated sizes (Mixer::arena_use) call it with an ArenaCount, so the sizes are counted from the
// allocations themselves and cannot drift from them (docs/memory.md).
#include <algorithm>
#include <cstddef>

#include "core/arena.h"
#include "core/tensor.h"

namespace hlm {

class ArenaCount {
 public:
  float* floats(i64 n, const char* = nullptr) {
    add(sizeof(float) * static_cast<std::size_t>(n));
    return nullptr;
  }
  int* ints(i64 n, const char* = nullptr) {
    add(sizeof(int) * static_cast<std::size_t>(n));
    return nullptr;
  }
  std::size_t mark() const { return used_; }
  void release_to(std::size_t mark) { used_ = mark; }
  std::size_t used() const { return used_; }
  std::size_t high_water() const { return high_water_; }
  // The same in floats (exact: every allocation is a multiple of 64 bytes).
  i64 used_floats() const { return static_cast<i64>(used_ / sizeof(float)); }
  i64 high_water_floats() const { return static_cast<i64>(high_water_ / sizeof(float)); }

 private:
  void add(std::size_t bytes) {
    used_ += Arena::rounded(bytes);
    high_water_ = std::max(high_water_, used_);
  }
  std::size_t used_ = 0, high_water_ = 0;
};

// What an allocation sequence leaves in use and its peak, in floats: list(ArenaCount&) run on a fresh counter.
struct CountedFloats {
  i64 used = 0, peak = 0;
};
template <class List>
CountedFloats count_floats(List&& list) {
  ArenaCount c;
  list(c);
  return {c.used_floats(), c.high_water_floats()};
}

}  // namespace hlm
