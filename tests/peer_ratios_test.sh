#!/usr/bin/env bash
# bench/tools/peer_ratios.py (the closing table of bench/compare_peer.sh ROUNDS=N) on two hand-made rounds
# (tests/data/peer_ratios): round 1 has every peer, round 2 lacks torch 2.x's SDPA run; a preset without files
# gives an empty row. Each ratio pairs runs of one round: torch 2.x 3000/1500 and 2000/800, torch 1.13 3000/1000 and
# 2000/1000, GEMM-peak shares 150/300 and 100/250 (the peak is a round's best median, not its mean).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out=$(python3 "$root/bench/tools/peer_ratios.py" "$root/tests/data/peer_ratios/s" 2 lightning gdn)
expect=(
  'GEMM peak per round (GFLOP/s): 300, 250'
  '| `lightning` | 2500 (2000-3000) | 2.25x (2.00x-2.50x) | 2.50x (2.00x-3.00x) | 45.0% (40.0%-50.0%) | 1100 / 3300 |'
  '| `gdn` | - | - | - | - | - |'
)
for line in "${expect[@]}"; do
  grep -qF -- "$line" <<< "$out" || { printf 'missing line: %s\nin output:\n%s\n' "$line" "$out" >&2; exit 1; }
done
echo "peer_ratios: all ${#expect[@]} lines as expected"
