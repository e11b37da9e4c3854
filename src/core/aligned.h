#pragma once
// 64-byte aligned std::vector storage. Kernels (oneDNN included) take different code paths for
// differently aligned pointers, so alignment must not depend on where malloc happens to land:
// otherwise two identical runs can differ in the last bits.
#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace hlm {

template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes ? bytes : 64);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
};

template <typename T>
using aligned_vector = std::vector<T, AlignedAllocator<T>>;

}  // namespace hlm
