#!/usr/bin/env bash
# bench/tools/peer_ratios.py (the closing table of bench/compare_peer.sh ROUNDS=N) on two hand-made rounds
# (tests/data/peer_ratios): round 1 has every peer, round 2 lacks torch 2.x's SDPA run; a preset without files
# gives an empty row. Each ratio pairs runs of one round: torch 2.x 3000/1500 and 2000/800, torch 1.13 3000/1000 and
# 2000/1000, GEMM-peak shares 150/300 and 100/250 (the peak is a round's best median, not its mean). Then three
# rounds with bf16 runs (compare_peer.sh BF16=1) in two of them: bf16 / fp32 4800/3000 and 3000/2000, no peers.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out=$(python3 "$root/bench/tools/peer_ratios.py" "$root/tests/data/peer_ratios/s" 2 lightning gdn)
expect=(
  'GEMM peak per round (GFLOP/s): 300, 250'
  '| `lightning` | 2500 (2000-3000) | 2.25x (2.00x-2.50x) | 2.50x (2.00x-3.00x) | 45.0% (40.0%-50.0%) | 1100 / 3300 |'
  '| `gdn` | - | - | - | - | - |'
)
check() {  # check <output> <expected line>...
  local text=$1 line
  shift
  for line in "$@"; do
    grep -qF -- "$line" <<< "$text" || { printf 'missing line: %s\nin output:\n%s\n' "$line" "$text" >&2; exit 1; }
  done
}
check "$out" "${expect[@]}"
grep -q 'bf16' <<< "$out" && { printf 'a bf16 column without bf16 runs:\n%s\n' "$out" >&2; exit 1; }
out_bf16=$(python3 "$root/bench/tools/peer_ratios.py" "$root/tests/data/peer_ratios/b" 3 full)
expect_bf16=(
  'GEMM peak per round (GFLOP/s): -, -, -'
  '| peak RSS MB: hybridlm / torch 1.13 | bf16 / fp32 |'
  '| `full` | 2500 (2000-3000) | - | - | - | 1010 / - | 1.55x (1.50x-1.60x) |'
)
check "$out_bf16" "${expect_bf16[@]}"
echo "peer_ratios: all $((${#expect[@]} + ${#expect_bf16[@]})) lines as expected"
