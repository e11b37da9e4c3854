#pragma once
// The precision a micro-benchmark runs under, from one of its arguments: 0 fp32, 1 --precision bf16 (the products
// in bf16 where the CPU has AVX512_BF16, ops/bf16_pairs.h). A bf16 run is skipped, with the reason, elsewhere.
#include <benchmark/benchmark.h>

#include <memory>

#include "ops/bf16_pairs.h"
#include "ops/precision.h"

namespace hlm::bench {

// Sets `scope` to bf16 when argument `arg` is 1; false (and the run skipped) when bf16 products cannot run here.
inline bool precision_of(benchmark::State& st, int arg, std::unique_ptr<ops::PrecisionScope>& scope) {
  if (st.range(arg) == 0) return true;
  if (!ops::bf16_pairs::available()) {
    st.SkipWithError("no AVX512_BF16 on this CPU");
    return false;
  }
  scope = std::make_unique<ops::PrecisionScope>(ops::Precision::bf16, /*allow_emulated=*/true);
  return true;
}

}  // namespace hlm::bench
