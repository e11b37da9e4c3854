#pragma once
#include <chrono>

namespace hlm {

class Timer {
 public:
  Timer() : t0_(clock::now()) {}
  void reset() { t0_ = clock::now(); }
  double seconds() const { return std::chrono::duration<double>(clock::now() - t0_).count(); }
  double ms() const { return seconds() * 1e3; }

 private:
  using clock = std::chrono::steady_clock;
  clock::time_point t0_;
};

}  // namespace hlm
