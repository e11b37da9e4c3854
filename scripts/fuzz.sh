#!/usr/bin/env bash
# Runs a libFuzzer target for SECONDS, starting from its seed corpus (fuzz/corpus/<target>/, committed) plus
# what earlier runs found (build/<preset>/fuzz-corpus/<target>/, not committed). TARGET is a name from fuzz/
# without the fuzz_ prefix (safetensors, gguf, model_config, memory_estimate, run_json, trainer_state, metrics,
# token_shard, tokenizer, vocab_tokenizer, sweep_plan) or "all" (every target the preset builds; JOBS at a time).
# Builds the preset first: PRESET=asan (default; clang, ASan + UBSan, the whole library) or PRESET=readers-asan (the readers
# of untrusted files alone: builds in minutes, CI's sanitizer stage; no memory_estimate, which needs the engine).
# A finding (crash, sanitizer report, leak, timeout, over the memory limits) leaves its input as
# build/<preset>/fuzz-crashes/<target>/ and exits non-zero.
#   scripts/fuzz.sh safetensors 600
#   JOBS=2 PRESET=readers-asan scripts/fuzz.sh all 15   # CI's smoke run (scripts/sanitize_readers.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh TARGET|all SECONDS}
seconds=${2:-60}
preset=${PRESET:-asan}
build=build/$preset
targets=()
if [[ $target == all ]]; then
  for f in fuzz/fuzz_*.cpp; do
    n=$(basename "$f" .cpp)
    [[ $preset == readers-asan && $n == fuzz_memory_estimate ]] && continue  # not built without the engine
    targets+=("${n#fuzz_}")
  done
else
  [[ -f fuzz/fuzz_$target.cpp ]] || { echo "fuzz.sh: no target fuzz/fuzz_$target.cpp" >&2; exit 2; }
  targets=("$target")
fi
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" --target "${targets[@]/#/fuzz_}"

run_one() {
  local t=$1 work=$build/fuzz-corpus/$1 crashes=$build/fuzz-crashes/$1 log=$build/fuzz-$1.log dict=() seeds=fuzz/corpus/$1
  mkdir -p "$work" "$crashes"
  case $t in
    safetensors|token_shard|tokenizer) ;;
    gguf) dict=(-dict=fuzz/gguf.dict) ;;
    *) dict=(-dict=fuzz/json.dict) ;;
  esac
  [[ $t == memory_estimate ]] && seeds=fuzz/corpus/model_config
  # Leaks are reported at exit only; -rss_limit_mb bounds a run away allocation (the readers must refuse first).
  local rc=0
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$build/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 \
    -timeout=10 -error_exitcode=77 -print_final_stats=1 -artifact_prefix="$crashes/" "${dict[@]}" "$work" "$seeds" \
    >"$log" 2>&1 || rc=$?
  local execs
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  if ((rc == 0)); then
    echo "fuzz $t: ${seconds}s, $execs executions, no crash"
  else
    echo "fuzz $t: FAILED (exit $rc) after $execs executions; log $log, input in $crashes/" >&2
    tail -40 "$log" >&2
  fi
  return $rc
}

jobs=${JOBS:-1}
status=0
pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  if ((${#pids[@]} >= jobs)); then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
