#!/usr/bin/env bash
# Same-sitting comparison with the PyTorch peers, alternating per preset, each on the bench config (d 256,
# 4x64 heads, SwiGLU 768, vocab 4096, 8 layers, batch 8 x 1024):
#   hybridlm bench                     (its SIMD target: the `simd` field)
#   torch 1.13 peer (Debian python3-torch)               PEER=<dir with bench_tuned.sh>
#   torch 2.x peer (PyPI, in a venv its setup_venv.sh makes) PEER2=<dir with run_bench.sh, setup_venv.sh>,
#     with SDPA and with explicit attention (compare with the better of the two); PEER2_EXTRA="--compile" or
#     "--autocast bf16" adds those runs; HLM_EXTRA="--precision bf16" runs hybridlm in bf16 (docs/precision.md).
# The peers live outside this repository (a measuring stick beside the project); a peer whose variable is unset
# or whose directory is missing is skipped with a note. Usage: PEER=... PEER2=... bench/compare_peer.sh [preset...]
# (default: swa128-nope full). Writes bench/results/<date>-<HHMM>-r<round>-<preset>-<who>.json and prints a line
# per run: tokens/s, model GFLOP/s and the ISA that ran (hybridlm's SIMD target; torch's "CPU capability").
# ROUNDS=N (default 1) repeats the whole comparison N times, measuring the fp32 GEMM peak before each round
# (hybridlm_microbench BM_Matmul, if built), and ends with the table the targets are stated in: per preset, the
# median and range over rounds of hybridlm's tokens/s over each peer's in the same round (torch 2.x: the better of
# its runs), hybridlm's model GFLOP/s as a share of that round's GEMM peak, and peak RSS. Paired per round, because a
# shared machine's speed drifts by tens of percent within minutes. BF16=1 also runs hybridlm with `--precision bf16`
# right after its fp32 run (CPUs with AVX512_BF16 or AMX; docs/precision.md) and adds the table's bf16 / fp32
# column, paired per round as the rest. Run nothing else meanwhile (2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/release/hybridlm}
STEPS=${STEPS:-5} WARMUP=${WARMUP:-2} ROUNDS=${ROUNDS:-1}
MICROBENCH=${MICROBENCH:-$(dirname "$BIN")/hybridlm_microbench}
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
  echo "compare_peer.sh: ROUNDS must be a positive integer, got '$ROUNDS'" >&2
  exit 2
fi
BF16=${BF16:-0}
if [[ "$BF16" != 0 && "$BF16" != 1 ]]; then
  echo "compare_peer.sh: BF16 must be 0 or 1, got '$BF16'" >&2
  exit 2
fi
mkdir -p bench/results
d=$(date +%Y-%m-%d-%H%M)
presets=("$@"); [ ${#presets[@]} -gt 0 ] || presets=(swa128-nope full)

# One summary line from a hybridlm or peer JSON file.
summary() {
  python3 - "$1" "$2" <<'PY'
import json, re, sys
who, path = sys.argv[1], sys.argv[2]
j = json.load(open(path))
if "train_tokens_per_s" in j:  # hybridlm bench --json
    print(f"{who:22s} {j['train_tokens_per_s']:8.0f} tok/s {j['train_gflops']:6.1f} GFLOP/s  ISA {j.get('simd', '?')}")
else:  # a peer results file
    r = j["results"][0]
    cap = [c for c in j["machine"].get("torch_config", []) if "CPU capability" in c]
    isa = re.sub(r".*CPU capability usage:\s*", "", cap[0]) if cap else ("avx512 CPU" if j["machine"].get("avx512") else "?")
    print(f"{who:22s} {r['train_tokens_per_s']:8.0f} tok/s {r['train_gflops']:6.1f} GFLOP/s  ISA {isa} "
          f"(torch {j['machine']['torch']}, {j['machine'].get('attention_impl', '?')})")
PY
}

peer_ok() { [ -n "${1:-}" ] && [ -d "$1" ]; }
peer_ok "${PEER:-}" || echo "note: PEER unset or missing: torch 1.13 peer skipped" >&2
# Debian's python3-torch runs on whatever libblas.so.3 is installed; the reference BLAS makes it ~100x slower.
if peer_ok "${PEER:-}" && ! ls /usr/lib/*/openblas*/libblas.so.3 > /dev/null 2>&1; then
  echo "note: OpenBLAS is not installed: torch 1.13 would use the reference BLAS (apt-get install libopenblas0-pthread)" >&2
fi
if peer_ok "${PEER2:-}"; then
  "$PEER2/setup_venv.sh"
else
  echo "note: PEER2 unset or missing: torch 2.x peer skipped" >&2
fi

for r in $(seq "$ROUNDS"); do
  [ "$ROUNDS" -gt 1 ] && echo "round $r of $ROUNDS"
  if [ -x "$MICROBENCH" ]; then
    "$MICROBENCH" --benchmark_filter='BM_Matmul/' --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      --benchmark_format=json > "bench/results/$d-r$r-gemm-peak.json" 2> /dev/null ||
      echo "note: $MICROBENCH failed: no GEMM peak for round $r" >&2
  fi
  for p in "${presets[@]}"; do
    out="bench/results/$d-r$r-$p"
    $BIN bench --preset "$p" --batch 8 --seq-len 1024 --steps "$STEPS" --warmup "$WARMUP" ${HLM_EXTRA:-} \
      --json > "$out-hybridlm.json"
    summary "$p hybridlm" "$out-hybridlm.json"
    if [ "$BF16" = 1 ]; then
      $BIN bench --preset "$p" --batch 8 --seq-len 1024 --steps "$STEPS" --warmup "$WARMUP" --precision bf16 \
        --json > "$out-hybridlm-bf16.json" && summary "$p hybridlm bf16" "$out-hybridlm-bf16.json" ||
        { rm -f "$out-hybridlm-bf16.json"; echo "$p hybridlm --precision bf16 failed" >&2; }
    fi
    if peer_ok "${PEER:-}"; then
      (cd "$PEER" && ./bench_tuned.sh --configs "$p" --steps "$STEPS" --warmup "$WARMUP" --prefill 1024 \
        --prefill-reps 1 --out "$OLDPWD/$out-peer.json" > /dev/null 2>&1) && summary "$p torch1.13" "$out-peer.json" ||
        echo "$p torch 1.13 peer failed" >&2
    fi
    if peer_ok "${PEER2:-}"; then
      for attn in sdpa explicit; do
        (cd "$PEER2" && ./run_bench.sh --configs "$p" --steps "$STEPS" --warmup "$WARMUP" --prefill 0 --attn "$attn" \
          ${PEER2_EXTRA:-} --out "$OLDPWD/$out-peer2-$attn.json" > /dev/null 2>&1) &&
          summary "$p torch2 $attn" "$out-peer2-$attn.json" || echo "$p torch 2.x peer ($attn) failed" >&2
      done
    fi
  done
done
python3 bench/tools/peer_ratios.py "bench/results/$d" "$ROUNDS" "${presets[@]}"
