#!/usr/bin/env bash
# Runs a libFuzzer target for SECONDS, starting from its seed corpus (fuzz/corpus/<target>/, committed) plus
# what earlier runs found (build/asan/fuzz-corpus/<target>/, not committed). TARGET is a name from fuzz/
# without the fuzz_ prefix (safetensors, model_config, run_json, trainer_state, metrics, token_shard,
# tokenizer, sweep_plan) or "all" (one after another). Builds the asan preset (clang, ASan + UBSan) first.
# A crash leaves its input as build/asan/fuzz-crashes/<target>/crash-* and exits non-zero.
#   scripts/fuzz.sh safetensors 600
#   JOBS=2 scripts/fuzz.sh all 30      # CI smoke run: two targets at a time
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh TARGET|all SECONDS}
seconds=${2:-60}
targets=()
if [[ $target == all ]]; then
  for f in fuzz/fuzz_*.cpp; do n=$(basename "$f" .cpp); targets+=("${n#fuzz_}"); done
else
  [[ -f fuzz/fuzz_$target.cpp ]] || { echo "fuzz.sh: no target fuzz/fuzz_$target.cpp" >&2; exit 2; }
  targets=("$target")
fi
cmake --preset asan >/dev/null
cmake --build --preset asan --target "${targets[@]/#/fuzz_}"

run_one() {
  local t=$1 work=build/asan/fuzz-corpus/$1 crashes=build/asan/fuzz-crashes/$1 dict=()
  mkdir -p "$work" "$crashes"
  case $t in safetensors|token_shard|tokenizer) ;; *) dict=(-dict=fuzz/json.dict) ;; esac
  # Leaks are reported at exit only; -rss_limit_mb bounds a run away allocation (the readers must refuse first).
  local rc=0
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "build/asan/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$crashes/" "${dict[@]}" "$work" "fuzz/corpus/$t" \
    >"build/asan/fuzz-$t.log" 2>&1 || rc=$?
  local execs
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "build/asan/fuzz-$t.log" | grep -o '[0-9]*$' || echo "?")
  if ((rc == 0)); then
    echo "fuzz $t: ${seconds}s, $execs executions, no crash"
  else
    echo "fuzz $t: FAILED (exit $rc) after $execs executions; log build/asan/fuzz-$t.log, input in $crashes/" >&2
    tail -40 "build/asan/fuzz-$t.log" >&2
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
