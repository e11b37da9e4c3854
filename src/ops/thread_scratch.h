#pragma once
// Scratch memory of the kernels, per thread: grown on demand and kept for the life of the thread, so steady-state
// calls allocate and page-fault nothing (fresh pages are very costly on these machines, and OpenMP keeps its
// worker threads). A slot is one buffer: a thread holding several at once uses several slots, and no kernel
// holds a slot across a call to another kernel. Buffers are 64-byte aligned; grown ones keep their contents
// and the new part starts at zero.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>

#include "core/error.h"
#include "core/tensor.h"

namespace hlm::ops {

constexpr int kScratchSlots = 16;

template <typename Real>
Real* thread_scratch(int slot, i64 n) {
  struct Free {
    void operator()(Real* p) const { std::free(p); }
  };
  struct Buffer {
    std::unique_ptr<Real, Free> p;
    i64 n = 0;
  };
  thread_local Buffer slots[kScratchSlots];
  HLM_CHECK(slot >= 0 && slot < kScratchSlots, "thread_scratch: slot {} out of range", slot);
  Buffer& b = slots[slot];
  if (b.n < n) {
    const size_t bytes = (static_cast<size_t>(n) * sizeof(Real) + 63) / 64 * 64;
    std::unique_ptr<Real, Free> p(static_cast<Real*>(std::aligned_alloc(64, bytes)));
    HLM_CHECK(p != nullptr, "thread_scratch: out of memory for {} elements", n);
    if (b.n > 0) std::memcpy(p.get(), b.p.get(), static_cast<size_t>(b.n) * sizeof(Real));
    std::memset(p.get() + b.n, 0, bytes - static_cast<size_t>(b.n) * sizeof(Real));
    b.p = std::move(p);
    b.n = n;
  }
  return b.p.get();
}

// The same as a span of n elements.
template <typename T>
std::span<T> thread_scratch_span(int slot, i64 n) {
  return {thread_scratch<T>(slot, n), static_cast<size_t>(n)};
}

}  // namespace hlm::ops
