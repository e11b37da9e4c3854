#pragma once
// How finely the sequence kernels split their work over threads.
#include <algorithm>

#include "core/tensor.h"

namespace hlm::ops {

// min_per_thread for parallel_for: tasks per thread so that each thread gets at least ~32K multiply-adds, so tiny
// problems (decode steps, tests) stay on one thread instead of paying for a parallel region.
inline i64 min_tasks(i64 work_per_task) { return std::max<i64>(1, (i64{1} << 15) / std::max<i64>(1, work_per_task)); }

}  // namespace hlm::ops
