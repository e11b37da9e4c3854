#pragma once
// OpenMP helpers with fixed (static) partitioning: for a given thread count every index always goes to
// the same thread, and reductions are combined in a fixed order, so results are deterministic.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/tensor.h"

namespace hlm {

inline int num_threads() { return omp_get_max_threads(); }

// fn(begin, end) over contiguous static blocks of [0, n).
template <typename Fn>
void parallel_for(i64 n, Fn&& fn, i64 min_per_thread = 1) {
  int nt = static_cast<int>(std::min<i64>(num_threads(), std::max<i64>(1, n / std::max<i64>(1, min_per_thread))));
  if (nt <= 1 || omp_in_parallel()) {
    fn(i64{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
    i64 b = n * t / nt, e = n * (t + 1) / nt;
    if (b < e) fn(b, e);
  }
}

// fn(i) for each i in [0, n), statically scheduled.
template <typename Fn>
void parallel_for_each(i64 n, Fn&& fn) {
  parallel_for(n, [&](i64 b, i64 e) {
    for (i64 i = b; i < e; ++i) fn(i);
  });
}

// Deterministic sum of fn(b, e) partials over static blocks (combined in thread order).
template <typename Fn>
double parallel_sum(i64 n, Fn&& fn) {
  int nt = std::max(1, num_threads());
  std::vector<double> part(nt, 0.0);
  if (omp_in_parallel() || nt == 1) return fn(i64{0}, n);
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
    i64 b = n * t / nt, e = n * (t + 1) / nt;
    if (b < e) part[t] = fn(b, e);
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

}  // namespace hlm
