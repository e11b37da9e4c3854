#!/usr/bin/env bash
# CI's sanitizer stage (docs/reliability.md): the readers of untrusted files alone (safetensors, model configs, the
# data layer, run.json / trainer_state / latest, metrics, sweep and study plans), built with clang 14 under
# AddressSanitizer + UBSan (the readers-asan preset: a few minutes on 2 cores, not the whole engine), then their
# unit tests (hybridlm_reader_tests, leak detection on) and every fuzz target for FUZZ_SECONDS (default 15), two at
# a time. Any sanitizer report, leak or fuzz finding fails. The whole library under the sanitizers is
# scripts/sanitize.sh (too slow for CI on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
cmake --preset readers-asan >/dev/null
cmake --build --preset readers-asan
t1=$SECONDS
ctest --preset readers-asan
t2=$SECONDS
JOBS=2 PRESET=readers-asan scripts/fuzz.sh all "${FUZZ_SECONDS:-30}"
echo "sanitize_readers: build $((t1 - t0)) s, unit tests $((t2 - t1)) s, fuzz $((SECONDS - t2)) s"
