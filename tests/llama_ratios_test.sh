#!/usr/bin/env bash
# bench/tools/llama_ratios.py (the closing table of bench/compare_llama.sh) on two hand-made rounds
# (tests/data/llama_ratios): model m has a prefill test with every side in round 1 and no BF16 run in round 2
# (ratios 900/600 and 800/400 against F32, 900/1000 against BF16; peak RSS medians 105 / 200 / 150 MiB) and a decode
# test without RSS files (60/100 and 50/100; 60/150); model x has no files and gives empty rows. Then one --line.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
data=$root/tests/data/llama_ratios
out=$(python3 "$root/bench/tools/llama_ratios.py" "$data/s" 2 "m x" pp512 tg4@d512)
expect=(
  '| m | pp512 | 850.0 (800.0-900.0) | 500.0 (400.0-600.0) | 1000.0 | 1.75x (1.50x-2.00x) | 0.90x | 105 / 200 / 150 |'
  '| m | tg4@d512 | 55.0 (50.0-60.0) | 100.0 (100.0-100.0) | 150.0 | 0.55x (0.50x-0.60x) | 0.40x | - / - / - |'
  '| x | pp512 | - | - | - | - | - | - / - / - |'
  '| x | tg4@d512 | - | - | - | - | - | - / - / - |'
)
line=$(python3 "$root/bench/tools/llama_ratios.py" --line "$data/s-r1-m-pp512" "m pp512")
expect_line='hybridlm 900.0 tok/s, 100.0 MiB | llama-f32 600.0 tok/s, 200.0 MiB | llama-bf16 1000.0 tok/s, 150.0 MiB'
for want in "${expect[@]}"; do
  grep -qF -- "$want" <<< "$out" || { printf 'missing line: %s\nin output:\n%s\n' "$want" "$out" >&2; exit 1; }
done
grep -qF -- "$expect_line" <<< "$line" || { printf 'expected: %s\ngot: %s\n' "$expect_line" "$line" >&2; exit 1; }
echo "llama_ratios: all $((${#expect[@]} + 1)) lines as expected"
