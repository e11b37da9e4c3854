#!/usr/bin/env bash
# Same-sitting comparison with the PyTorch peer (../shared/bench/peer): hybridlm bench and the tuned peer
# for the given presets, alternating, each on the bench config (d 256, 4x64 heads, SwiGLU 768, vocab 4096,
# 8 layers, batch 8 x 1024). Usage: bench/compare_peer.sh [preset...]   (default: swa128-nope full)
# Writes bench/results/<date>-<preset>-{hybridlm,peer}.json. Run nothing else meanwhile (2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=${PEER:-../shared/bench/peer}
BIN=${BIN:-./build/release/hybridlm}
mkdir -p bench/results
d=$(date +%Y-%m-%d)
presets=("$@"); [ ${#presets[@]} -gt 0 ] || presets=(swa128-nope full)
for p in "${presets[@]}"; do
  $BIN bench --preset "$p" --batch 8 --seq-len 1024 --steps 5 --warmup 2 --json | tee "bench/results/$d-$p-hybridlm.json"
  if [ -d "$PEER" ]; then
    (cd "$PEER" && ./bench_tuned.sh --configs "$p" --prefill 1024 --prefill-reps 1 --out "$OLDPWD/bench/results/$d-$p-peer.json" 2>&1 | tail -3) || true
  fi
done
