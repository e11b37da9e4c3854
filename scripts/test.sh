#!/usr/bin/env bash
# Builds the release preset and runs the unit tests (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release "$@"
