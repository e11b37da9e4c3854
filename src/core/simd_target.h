#pragma once
// Which SIMD instruction set the hand-written kernels run with. Kernels are compiled once per target through
// Google Highway (docs/performance.md) and dispatched at run time to the best target the CPU supports; the
// environment variable HLM_SIMD (e.g. "AVX2", or "fallback" for the portable scalar/EMU128 target every build has)
// or set_simd_target() forces another one, so tests and benchmarks can run every compiled path on one machine.
#include <string>
#include <vector>

namespace hlm {

// Applies HLM_SIMD once (throws hlm::Error naming HLM_SIMD for an unknown or unsupported target). Every
// dispatching op calls it before its first dispatch.
void init_simd();

// The target dispatched kernels run with now ("AVX3", "AVX2", "NEON", "EMU128", ...).
std::string simd_target();

// Targets compiled into this binary that this CPU can run, best first.
std::vector<std::string> simd_targets_available();

// Forces `name` (one of simd_targets_available() or "fallback", case-insensitive); "" or "best" restores the
// default.
void set_simd_target(const std::string& name);

}  // namespace hlm
