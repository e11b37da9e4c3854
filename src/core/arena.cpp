#include "core/arena.h"

#include <cstdlib>
#include <cstring>

namespace hlm {

Arena::~Arena() { std::free(base_); }

void Arena::reserve(std::size_t bytes) {
  std::free(base_);
  base_ = nullptr;
  capacity_ = rounded(bytes);
  used_ = high_water_ = 0;
  if (capacity_ == 0) return;
  base_ = static_cast<char*>(std::aligned_alloc(64, capacity_));
  HLM_CHECK(base_ != nullptr, "Arena: cannot allocate {} MiB", capacity_ >> 20);
  std::memset(base_, 0, capacity_);  // fault every page in now, not in the hot loop
}

void* Arena::alloc_bytes(std::size_t bytes, const char* what) {
  const std::size_t need = rounded(bytes);
  HLM_CHECK(used_ + need <= capacity_, "Arena: out of memory allocating {} ({} bytes; {} of {} used)",
            what, bytes, used_, capacity_);
  void* p = base_ + used_;
  used_ += need;
  if (used_ > high_water_) high_water_ = used_;
  return p;
}

float* Arena::floats(i64 n, const char* what) {
  return static_cast<float*>(alloc_bytes(sizeof(float) * static_cast<std::size_t>(n), what));
}
int* Arena::ints(i64 n, const char* what) {
  return static_cast<int*>(alloc_bytes(sizeof(int) * static_cast<std::size_t>(n), what));
}

}  // namespace hlm
