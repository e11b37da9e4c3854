#!/usr/bin/env bash
# CI's sanitizer stage (docs/reliability.md): builds the asan preset (clang, AddressSanitizer + UBSan, the
# libFuzzer targets), runs the unit tests under it, then every fuzz target for FUZZ_SECONDS (default 30), two
# at a time. HLM_ASAN_FILTER picks the tests (a gtest filter; default: all but the slow trained-model suites,
# which the release run covers).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset asan >/dev/null
cmake --build --preset asan
# The asan preset compiles the Highway kernels for the build's own ISA only (HWY_COMPILE_ONLY_STATIC): clang 14
# crashes ("Do not know how to split the result of this operator") on per-target code inside OpenMP regions,
# whose outlined functions lose the target attribute. So the tests that force other SIMD targets are left out.
# Reproduce.TinyBudget* and ContinuesAfterAKill* train whole studies: over 10 minutes each under ASan on 2 cores.
filter=${HLM_ASAN_FILTER:-"-NiahTrained.*:Recall.*:SimdTarget.*:Reproduce.TinyBudget*:Reproduce.ContinuesAfterAKill*"}
t0=$SECONDS
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  build/asan/hybridlm_tests --gtest_filter="$filter" --gtest_brief=1
echo "sanitize: unit tests under ASan+UBSan in $((SECONDS - t0)) s"
JOBS=2 scripts/fuzz.sh all "${FUZZ_SECONDS:-30}"
