#!/usr/bin/env bash
# Builds the release preset and runs the unit tests (the README's test command). HLM_SLOW_TESTS=1 adds the
# opt-in `slow` label (the long learning tests) and the tests that build the real default corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build --preset release
preset=release
if [[ "${HLM_SLOW_TESTS:-}" == 1 ]]; then preset=release-slow; fi
ctest --preset "$preset" "$@"
