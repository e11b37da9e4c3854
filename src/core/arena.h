#pragma once
// Activation memory: one 64-byte-aligned block sized up front from the model config and reused every
// step. Page faults are very expensive on these VMs, so the block is touched once at creation and
// never returned to the OS while training runs.
#include <cstddef>
#include <string>

#include "core/tensor.h"

namespace hlm {

class Arena {
 public:
  Arena() = default;
  explicit Arena(std::size_t bytes) { reserve(bytes); }
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Bytes one allocation of `bytes` takes: rounded up to 64 (ArenaCount in core/arena_count.h counts the same).
  static constexpr std::size_t rounded(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

  // Allocates (and pre-faults) capacity; discards previous contents.
  void reserve(std::size_t bytes);
  // Bump-allocates n floats (64-byte aligned). Throws hlm::Error naming `what` when full.
  float* floats(i64 n, const char* what = "activation");
  int* ints(i64 n, const char* what = "activation");
  // Frees everything allocated since `mark`.
  std::size_t mark() const { return used_; }
  void release_to(std::size_t mark) { used_ = mark; }
  void reset() { used_ = 0; }
  std::size_t used() const { return used_; }
  std::size_t capacity() const { return capacity_; }
  std::size_t high_water() const { return high_water_; }

 private:
  void* alloc_bytes(std::size_t bytes, const char* what);
  char* base_ = nullptr;
  std::size_t capacity_ = 0, used_ = 0, high_water_ = 0;
};

}  // namespace hlm
